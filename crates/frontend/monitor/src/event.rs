//! What the monitor reports: a [`Snapshot`] of a served array's state, and
//! the [`Event`]s found by comparing two of them ([`diff`]), as mdadm's
//! monitor compares two readings of /proc/mdstat. Pure: no I/O here.

use std::fmt;

/// An event's kind; its name (`Display`) is what the alert program gets as
/// its first argument and journald as `NVRAID_EVENT` (mdadm's names where
/// mdadm has the event).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// A member was marked faulty (or left its role while working, which
    /// only a failure does).
    Fail,
    /// The array was started degraded, or became degraded.
    DegradedArray,
    /// A member began to be rebuilt (a new member, a re-add by bitmap, a
    /// hot spare), or the background resync of a dirty array began.
    RebuildStarted,
    /// That rebuild or resync reached the end.
    RebuildFinished,
    /// A rebuild or resync stopped on an error; the array stays degraded
    /// (or dirty).
    RebuildFailed,
    /// A check or repair found copies (or parity) that disagree.
    Mismatches,
    /// A member's error count grew.
    DeviceErrors,
    /// A member that was being rebuilt is now active (in sync) in its role.
    SpareActive,
}

impl EventKind {
    /// Every kind, for documentation and tests.
    pub const ALL: [EventKind; 8] = [
        EventKind::Fail,
        EventKind::DegradedArray,
        EventKind::RebuildStarted,
        EventKind::RebuildFinished,
        EventKind::RebuildFailed,
        EventKind::Mismatches,
        EventKind::DeviceErrors,
        EventKind::SpareActive,
    ];

    pub fn name(self) -> &'static str {
        match self {
            EventKind::Fail => "Fail",
            EventKind::DegradedArray => "DegradedArray",
            EventKind::RebuildStarted => "RebuildStarted",
            EventKind::RebuildFinished => "RebuildFinished",
            EventKind::RebuildFailed => "RebuildFailed",
            EventKind::Mismatches => "Mismatches",
            EventKind::DeviceErrors => "DeviceErrors",
            EventKind::SpareActive => "SpareActive",
        }
    }

    /// syslog priority for journald: 2 (crit) when the array lost
    /// redundancy, 4 (warning) for trouble that did not cost it, 5
    /// (notice) for recovery going as it should.
    pub fn priority(self) -> u8 {
        match self {
            EventKind::Fail | EventKind::DegradedArray | EventKind::RebuildFailed => 2,
            EventKind::Mismatches | EventKind::DeviceErrors => 4,
            EventKind::RebuildStarted | EventKind::RebuildFinished | EventKind::SpareActive => 5,
        }
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One event: its kind, the member it concerns (its spec, as given to
/// `serve`), and a sentence for the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub kind: EventKind,
    pub member: Option<String>,
    pub message: String,
}

impl Event {
    fn new(kind: EventKind, member: Option<&str>, message: String) -> Event {
        Event {
            kind,
            member: member.map(str::to_string),
            message,
        }
    }
}

/// A member's state, as `detail` names it: `active`, `rebuilding`,
/// `faulty`, `missing`, `spare`, `stale`, `journal`, ...
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemberSnapshot {
    /// The role it holds; `None` for a member set aside (spare, stale...).
    pub role: Option<u32>,
    /// Its spec; `None` for a missing role.
    pub path: Option<String>,
    pub state: String,
    /// In sync below this many bytes (a member being rebuilt).
    pub in_sync_bytes: Option<u64>,
    /// Member operations, bytes and errors of the served I/O (reads and
    /// writes together: the array counts them so).
    pub ops: u64,
    pub bytes: u64,
    pub errors: u64,
}

impl MemberSnapshot {
    fn working(&self) -> bool {
        self.state == "active" || self.state == "rebuilding"
    }
}

/// A rebuild, resync, check or repair: how far it got.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// The role rebuilt (rebuilds only).
    pub role: Option<u32>,
    /// The member rebuilt (rebuilds only).
    pub member: Option<String>,
    pub done_bytes: u64,
    pub total_bytes: u64,
    pub finished: bool,
    pub error: Option<String>,
}

impl Progress {
    pub fn running(&self) -> bool {
        !self.finished && self.error.is_none()
    }

    /// done / total, 0 before the total is known.
    pub fn ratio(&self) -> f64 {
        if self.finished && self.error.is_none() {
            1.0
        } else if self.total_bytes == 0 {
            0.0
        } else {
            self.done_bytes as f64 / self.total_bytes as f64
        }
    }
}

/// A check or repair on request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScrubSnapshot {
    /// Counts the checks and repairs started, so that two runs with the
    /// same outcome are told apart.
    pub run: u64,
    /// `check` or `repair`.
    pub mode: String,
    pub progress: Progress,
    /// 512-byte sectors found to differ (once finished).
    pub mismatch_sectors: Option<u64>,
}

/// A served array's state at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub name: String,
    pub uuid: String,
    pub level: u32,
    /// `clean` or `active`, with `, degraded`.
    pub state: String,
    pub degraded: bool,
    pub size_bytes: u64,
    pub raid_disks: u32,
    /// One per role (missing roles included), then the members set aside.
    pub members: Vec<MemberSnapshot>,
    /// The rebuild running or last run.
    pub rebuild: Option<Progress>,
    /// The background resync of an array that came up dirty.
    pub resync: Option<Progress>,
    pub scrub: Option<ScrubSnapshot>,
}

impl Snapshot {
    fn role(&self, role: u32) -> Option<&MemberSnapshot> {
        self.members.iter().find(|m| m.role == Some(role))
    }

    fn member(&self, m: &MemberSnapshot) -> String {
        match (&m.path, m.role) {
            (Some(path), _) => path.clone(),
            (None, Some(role)) => format!("role {role}"),
            (None, None) => "?".into(),
        }
    }
}

/// What an array served in the state `now` reports at start: degraded, a
/// rebuild or resync resumed.
pub fn startup(now: &Snapshot) -> Vec<Event> {
    let mut events = Vec::new();
    if now.degraded {
        events.push(degraded(now));
    }
    for m in now.members.iter().filter(|m| m.state == "rebuilding") {
        events.push(rebuild_started(now, m));
    }
    if let Some(resync) = now.resync.as_ref().filter(|r| r.running()) {
        events.push(resync_started(now, resync));
    }
    events
}

/// The events between two snapshots of one array, in the order they
/// happened as far as the snapshots tell.
pub fn diff(previous: &Snapshot, now: &Snapshot) -> Vec<Event> {
    let mut events = Vec::new();
    let idle = MemberSnapshot {
        state: "missing".into(),
        ..MemberSnapshot::default()
    };
    // A level change renumbering the roles (RAID 0 <-> RAID 10) moves
    // working members to other roles, and one taking a RAID 10 to RAID 0
    // lets the second copies leave: neither is a failure.
    let reshaped = previous.level != now.level || previous.raid_disks != now.raid_disks;
    let placed_now = |path: &Option<String>| {
        path.is_some()
            && now
                .members
                .iter()
                .any(|n| n.role.is_some() && n.path == *path && n.working())
    };
    for m in now.members.iter().filter(|m| m.role.is_some()) {
        let role = m.role.unwrap_or_default();
        let before = previous.role(role).unwrap_or(&idle);
        let same = before.path.is_some() && before.path == m.path;
        // The member in this role held another one before the renumbering.
        let moved = previous.members.iter().find(|b| {
            reshaped && !same && b.role.is_some() && b.path.is_some() && b.path == m.path
        });
        let left = reshaped
            && !now
                .members
                .iter()
                .any(|n| n.path.is_some() && n.path == before.path);
        if !same && before.working() && !placed_now(&before.path) && !left {
            // Another member (or none) holds the role of one that was
            // working: only a failure takes a working member out (a
            // remove needs it faulty first).
            events.push(Event::new(
                EventKind::Fail,
                before.path.as_deref(),
                format!(
                    "array {}: member {} of role {role} failed and left the array",
                    now.name,
                    previous.member(before)
                ),
            ));
        }
        let was = match (same, moved) {
            (true, _) => before.state.as_str(),
            (false, Some(b)) => b.state.as_str(),
            (false, None) => "missing",
        };
        match (was, m.state.as_str()) {
            ("active" | "rebuilding", "faulty") => events.push(Event::new(
                EventKind::Fail,
                m.path.as_deref(),
                format!(
                    "array {}: member {} (role {role}) marked faulty",
                    now.name,
                    now.member(m)
                ),
            )),
            ("missing" | "faulty", "faulty") if !same => events.push(Event::new(
                EventKind::Fail,
                m.path.as_deref(),
                format!(
                    "array {}: member {} (role {role}) joined and failed",
                    now.name,
                    now.member(m)
                ),
            )),
            ("missing" | "faulty", "rebuilding") => events.push(rebuild_started(now, m)),
            ("missing" | "faulty", "active") => {
                // Joined and rebuilt between two looks.
                events.push(rebuild_started(now, m));
                events.extend(rebuild_finished(now, m));
            }
            ("rebuilding", "active") => events.extend(rebuild_finished(now, m)),
            _ => {}
        }
        if same && m.errors > before.errors {
            events.push(device_errors(now, m, before.errors));
        }
    }
    for m in now.members.iter().filter(|m| m.role.is_none()) {
        let before = previous
            .members
            .iter()
            .find(|b| b.role.is_none() && b.path.is_some() && b.path == m.path);
        if let Some(before) = before.filter(|b| m.errors > b.errors) {
            events.push(device_errors(now, m, before.errors));
        }
    }
    if now.degraded && !previous.degraded {
        events.push(degraded(now));
    }
    if let Some(rebuild) = &now.rebuild {
        let new_error = match &previous.rebuild {
            Some(p) => p.error.is_none() || p.role != rebuild.role || p.member != rebuild.member,
            None => true,
        };
        if let (Some(error), true) = (&rebuild.error, new_error) {
            events.push(Event::new(
                EventKind::RebuildFailed,
                rebuild.member.as_deref(),
                format!(
                    "array {}: rebuild of {} failed: {error}; the array stays degraded",
                    now.name,
                    rebuild.member.as_deref().unwrap_or("a member")
                ),
            ));
        }
    }
    events.extend(resync_events(previous, now));
    events.extend(mismatches(previous, now));
    events
}

fn degraded(now: &Snapshot) -> Event {
    let working = now
        .members
        .iter()
        .filter(|m| m.role.is_some() && m.state == "active")
        .count();
    Event::new(
        EventKind::DegradedArray,
        None,
        format!(
            "array {}: degraded: {working} of {} members in sync",
            now.name, now.raid_disks
        ),
    )
}

fn rebuild_started(now: &Snapshot, m: &MemberSnapshot) -> Event {
    Event::new(
        EventKind::RebuildStarted,
        m.path.as_deref(),
        format!(
            "array {}: rebuild of {} (role {}) started",
            now.name,
            now.member(m),
            m.role.unwrap_or_default()
        ),
    )
}

fn rebuild_finished(now: &Snapshot, m: &MemberSnapshot) -> [Event; 2] {
    let role = m.role.unwrap_or_default();
    [
        Event::new(
            EventKind::RebuildFinished,
            m.path.as_deref(),
            format!(
                "array {}: rebuild of {} (role {role}) finished",
                now.name,
                now.member(m)
            ),
        ),
        Event::new(
            EventKind::SpareActive,
            m.path.as_deref(),
            format!(
                "array {}: {} is active in role {role}",
                now.name,
                now.member(m)
            ),
        ),
    ]
}

fn device_errors(now: &Snapshot, m: &MemberSnapshot, before: u64) -> Event {
    Event::new(
        EventKind::DeviceErrors,
        m.path.as_deref(),
        format!(
            "array {}: member {} had {} new I/O errors ({} in all)",
            now.name,
            now.member(m),
            m.errors - before,
            m.errors
        ),
    )
}

fn resync_started(now: &Snapshot, resync: &Progress) -> Event {
    Event::new(
        EventKind::RebuildStarted,
        None,
        format!(
            "array {}: resync of the array started ({} of {} bytes done)",
            now.name, resync.done_bytes, resync.total_bytes
        ),
    )
}

/// The background resync: started, finished, failed.
fn resync_events(previous: &Snapshot, now: &Snapshot) -> Vec<Event> {
    let Some(resync) = &now.resync else {
        return Vec::new();
    };
    let before = previous.resync.as_ref();
    let mut events = Vec::new();
    if before.is_none() {
        events.push(resync_started(now, resync));
    }
    let was_running = before.is_none_or(Progress::running);
    if was_running && resync.finished && resync.error.is_none() {
        events.push(Event::new(
            EventKind::RebuildFinished,
            None,
            format!("array {}: resync of the array finished", now.name),
        ));
    }
    if was_running && resync.error.is_some() {
        events.push(Event::new(
            EventKind::RebuildFailed,
            None,
            format!(
                "array {}: resync of the array failed: {}",
                now.name,
                resync.error.as_deref().unwrap_or_default()
            ),
        ));
    }
    events
}

/// A check or repair that finished with mismatches (each run once).
fn mismatches(previous: &Snapshot, now: &Snapshot) -> Option<Event> {
    let scrub = now.scrub.as_ref()?;
    let sectors = scrub.mismatch_sectors.filter(|&s| s > 0)?;
    if !scrub.progress.finished {
        return None;
    }
    let seen = previous
        .scrub
        .as_ref()
        .is_some_and(|p| p.run == scrub.run && p.progress.finished);
    (!seen).then(|| {
        Event::new(
            EventKind::Mismatches,
            None,
            format!(
                "array {}: {} found {sectors} mismatched sectors",
                now.name, scrub.mode
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(role: u32, path: &str, state: &str) -> MemberSnapshot {
        MemberSnapshot {
            role: Some(role),
            path: (state != "missing").then(|| path.to_string()),
            state: state.into(),
            ..MemberSnapshot::default()
        }
    }

    fn array(states: &[&str]) -> Snapshot {
        let members: Vec<_> = states
            .iter()
            .enumerate()
            .map(|(i, s)| member(i as u32, &format!("m{i}"), s))
            .collect();
        Snapshot {
            name: "a".into(),
            degraded: members.iter().any(|m| m.state != "active"),
            raid_disks: members.len() as u32,
            members,
            ..Snapshot::default()
        }
    }

    fn kinds(events: &[Event]) -> Vec<(EventKind, Option<&str>)> {
        events
            .iter()
            .map(|e| (e.kind, e.member.as_deref()))
            .collect()
    }

    #[test]
    fn nothing_changed_nothing_reported() {
        let a = array(&["active", "active"]);
        assert!(diff(&a, &a).is_empty());
        let d = array(&["active", "faulty"]);
        assert!(diff(&d, &d).is_empty());
        assert!(startup(&a).is_empty());
    }

    #[test]
    fn a_member_marked_faulty_is_a_fail_and_the_array_degraded() {
        let before = array(&["active", "active"]);
        let now = array(&["active", "faulty"]);
        assert_eq!(
            kinds(&diff(&before, &now)),
            [
                (EventKind::Fail, Some("m1")),
                (EventKind::DegradedArray, None)
            ]
        );
        assert_eq!(EventKind::Fail.priority(), 2);
    }

    #[test]
    fn members_renumbered_by_a_level_change_neither_failed_nor_joined() {
        // A RAID 0 of two taken over as RAID 10 of four: m1 moves from
        // role 1 to role 2, roles 1 and 3 missing (the array degraded).
        let raid0 = array(&["active", "active"]);
        let mut raid10 = array(&["active", "missing", "active", "missing"]);
        raid10.members[2].path = Some("m1".into());
        raid10.level = 10;
        assert_eq!(
            kinds(&diff(&raid0, &raid10)),
            [(EventKind::DegradedArray, None)]
        );
        // And back: m1 moves to role 1 again; the second copies (n0,
        // n1) leave, no failure.
        let mut whole = array(&["active", "active", "active", "active"]);
        whole.level = 10;
        whole.members[1].path = Some("n0".into());
        whole.members[2].path = Some("m1".into());
        whole.members[3].path = Some("n1".into());
        assert!(diff(&whole, &raid0).is_empty());
        // Without a level change a working member gone still failed.
        let mut same_shape = whole.clone();
        same_shape.members[1] = member(1, "", "missing");
        same_shape.degraded = true;
        assert_eq!(
            kinds(&diff(&whole, &same_shape)),
            [
                (EventKind::Fail, Some("n0")),
                (EventKind::DegradedArray, None)
            ]
        );
    }

    #[test]
    fn a_working_member_gone_from_its_role_between_looks_failed() {
        let before = array(&["active", "active"]);
        let now = array(&["active", "missing"]);
        assert_eq!(
            kinds(&diff(&before, &now)),
            [
                (EventKind::Fail, Some("m1")),
                (EventKind::DegradedArray, None)
            ]
        );
        // A hot spare took the role within the same second.
        let mut spare = array(&["active", "rebuilding"]);
        spare.members[1].path = Some("s".into());
        assert_eq!(
            kinds(&diff(&before, &spare)),
            [
                (EventKind::Fail, Some("m1")),
                (EventKind::RebuildStarted, Some("s")),
                (EventKind::DegradedArray, None)
            ]
        );
    }

    #[test]
    fn started_degraded_is_reported_at_startup() {
        let now = array(&["active", "missing"]);
        assert_eq!(kinds(&startup(&now)), [(EventKind::DegradedArray, None)]);
        let now = array(&["active", "rebuilding"]);
        assert_eq!(
            kinds(&startup(&now)),
            [
                (EventKind::DegradedArray, None),
                (EventKind::RebuildStarted, Some("m1"))
            ]
        );
    }

    #[test]
    fn a_rebuild_starts_and_finishes_with_the_member_active() {
        let faulty = array(&["active", "faulty"]);
        let missing = array(&["active", "missing"]);
        let rebuilding = array(&["active", "rebuilding"]);
        let active = array(&["active", "active"]);
        assert!(diff(&faulty, &missing).is_empty());
        assert_eq!(
            kinds(&diff(&missing, &rebuilding)),
            [(EventKind::RebuildStarted, Some("m1"))]
        );
        assert_eq!(
            kinds(&diff(&rebuilding, &active)),
            [
                (EventKind::RebuildFinished, Some("m1")),
                (EventKind::SpareActive, Some("m1"))
            ]
        );
        // All of it between two looks: still both ends reported.
        assert_eq!(
            kinds(&diff(&faulty, &active)),
            [
                (EventKind::RebuildStarted, Some("m1")),
                (EventKind::RebuildFinished, Some("m1")),
                (EventKind::SpareActive, Some("m1"))
            ]
        );
        // Failed, removed and re-added between two looks: the same path
        // from faulty to rebuilding.
        assert_eq!(
            kinds(&diff(&faulty, &rebuilding)),
            [(EventKind::RebuildStarted, Some("m1"))]
        );
    }

    #[test]
    fn a_rebuild_error_is_reported_once() {
        let rebuilding = array(&["active", "rebuilding"]);
        let mut failed = rebuilding.clone();
        failed.rebuild = Some(Progress {
            role: Some(1),
            member: Some("m1".into()),
            error: Some("EIO".into()),
            ..Progress::default()
        });
        assert_eq!(
            kinds(&diff(&rebuilding, &failed)),
            [(EventKind::RebuildFailed, Some("m1"))]
        );
        assert!(diff(&failed, &failed).is_empty());
    }

    #[test]
    fn growing_error_counts_are_device_errors() {
        let before = array(&["active", "active"]);
        let mut now = before.clone();
        now.members[0].errors = 3;
        let events = diff(&before, &now);
        assert_eq!(kinds(&events), [(EventKind::DeviceErrors, Some("m0"))]);
        assert!(events[0].message.contains("3 new"), "{}", events[0].message);
        assert!(diff(&now, &now).is_empty());
        // A new member in the role starts its own count.
        let mut other = now.clone();
        other.members[0].path = Some("x".into());
        other.members[0].errors = 5;
        assert!(!kinds(&diff(&now, &other)).contains(&(EventKind::DeviceErrors, Some("x"))));
    }

    #[test]
    fn a_check_with_mismatches_is_reported_once_per_run() {
        let before = array(&["active", "active"]);
        let mut now = before.clone();
        let scrub = |run, finished, sectors| ScrubSnapshot {
            run,
            mode: "check".into(),
            progress: Progress {
                finished,
                ..Progress::default()
            },
            mismatch_sectors: sectors,
        };
        now.scrub = Some(scrub(1, false, None));
        assert!(diff(&before, &now).is_empty());
        let mut done = before.clone();
        done.scrub = Some(scrub(1, true, Some(8)));
        let events = diff(&now, &done);
        assert_eq!(kinds(&events), [(EventKind::Mismatches, None)]);
        assert!(events[0].message.contains("8 mismatched"));
        assert!(diff(&done, &done).is_empty());
        // A second run with the same outcome, all between two looks.
        let mut again = before.clone();
        again.scrub = Some(scrub(2, true, Some(8)));
        assert_eq!(kinds(&diff(&done, &again)), [(EventKind::Mismatches, None)]);
        // No mismatches: nothing.
        let mut clean = before.clone();
        clean.scrub = Some(scrub(3, true, Some(0)));
        assert!(diff(&done, &clean).is_empty());
    }

    #[test]
    fn a_resync_starts_finishes_or_fails() {
        let before = array(&["active", "active"]);
        let mut running = before.clone();
        running.resync = Some(Progress {
            done_bytes: 0,
            total_bytes: 100,
            ..Progress::default()
        });
        assert_eq!(
            kinds(&diff(&before, &running)),
            [(EventKind::RebuildStarted, None)]
        );
        assert_eq!(
            kinds(&startup(&running)),
            [(EventKind::RebuildStarted, None)]
        );
        let mut done = running.clone();
        done.resync.as_mut().unwrap().finished = true;
        assert_eq!(
            kinds(&diff(&running, &done)),
            [(EventKind::RebuildFinished, None)]
        );
        assert!(diff(&done, &done).is_empty());
        let mut failed = running.clone();
        failed.resync.as_mut().unwrap().error = Some("EIO".into());
        failed.resync.as_mut().unwrap().finished = true;
        assert_eq!(
            kinds(&diff(&running, &failed)),
            [(EventKind::RebuildFailed, None)]
        );
    }

    #[test]
    fn every_kind_has_a_distinct_name() {
        let names: std::collections::HashSet<_> = EventKind::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(names.len(), EventKind::ALL.len());
    }
}
