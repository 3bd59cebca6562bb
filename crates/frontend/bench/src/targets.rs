//! What bench does with nvraid's members and arrays: the engine `--engine
//! auto` picks for a set of members ([`engine_for`]), the fast-path target
//! over an array ([`array_target`]), random data written over an array
//! before it is measured ([`prefill`]), and the one line a report carries
//! on what it measured ([`array_subject`], [`subject_line`]).
//!
//! `nvraid bench`, `nvraid tune` (nvraid-tune), `nvraid serve` and
//! `nvraid topology --measure` share these.

use crate::cli::Engine;
use crate::Error;
use nvraid_array::{Array, FanoutTarget};
use nvraid_io::engine::EngineKind;
use nvraid_io::queue::Target;
use nvraid_member::{Member, MemberKind};
use std::path::Path;
use std::sync::Arc;

/// Writes random bytes over the first `len` bytes of `array` and flushes,
/// so that reads measure data rather than holes (bench's temporary array,
/// tune's throwaway arrays).
pub fn prefill(array: &Array, len: u64) -> Result<(), Error> {
    const BLOCK_BYTES: usize = 4 << 20;
    let mut block = nvraid_io::AlignedBuf::zeroed(BLOCK_BYTES);
    nvraid_io::random::fill(&mut block).map_err(Error::Random)?;
    let mut at = 0u64;
    while at < len {
        let n = (len - at).min(BLOCK_BYTES as u64) as usize;
        array.write_at(&block[..n], at, false)?;
        at += n as u64;
    }
    array.flush()?;
    Ok(())
}

/// The fast-path target over `array`, with the engine `choice` gives for
/// its present members ([`engine_for`]).
pub fn array_target(array: Arc<Array>, choice: Engine) -> Arc<dyn Target> {
    let members: Vec<&Member> = array.slots().iter().flatten().map(|s| &*s.member).collect();
    let engine = engine_for(choice, &members);
    Arc::new(FanoutTarget::array(array.clone(), engine))
}

/// One line on what an array is: "raid0, 4 members, chunk 512 KiB: a, b, c, d".
pub fn array_subject(array: &Array) -> String {
    let geometry = array.geometry();
    let members: Vec<String> = array
        .slots()
        .iter()
        .flatten()
        .map(|slot| slot.member.spec().to_string())
        .collect();
    subject_line(
        &geometry.level().to_string(),
        &members,
        geometry.chunk_bytes(),
    )
}

/// The one-line description of an array every report carries:
/// "raid0, 4 members, chunk 512 KiB: a, b, c, d" (no chunk: none given).
pub fn subject_line(level: &str, members: &[String], chunk_bytes: Option<u64>) -> String {
    let chunk = chunk_bytes
        .map(|bytes| format!(", chunk {} KiB", bytes >> 10))
        .unwrap_or_default();
    format!(
        "{level}, {} members{chunk}: {}",
        members.len(),
        members.join(", ")
    )
}

/// The engine for `auto`: psync when every member completes I/O inline in
/// the submitting thread (RAM-backed: mem:, tmpfs files, zram), where
/// io_uring only adds work; io_uring otherwise. Arrays of null: members only
/// never reach an engine (the queue completes their operations itself), so
/// they get the batching queue. The measurements behind the rule:
/// docs/performance-history.md#engine-choice---engine-auto.
pub fn engine_for(choice: Engine, members: &[&Member]) -> EngineKind {
    let all_null = members.iter().all(|m| m.kind() == MemberKind::Null);
    match choice {
        Engine::Uring => EngineKind::Uring,
        Engine::Psync => EngineKind::Psync,
        Engine::Auto if all_null => EngineKind::Uring,
        Engine::Auto if members.iter().all(|m| completes_inline(m)) => EngineKind::Psync,
        Engine::Auto => EngineKind::Uring,
    }
}

fn completes_inline(member: &Member) -> bool {
    match member.kind() {
        // Remote members never reach the inner engine (their worker
        // channels do their I/O), so they do not ask for io_uring.
        MemberKind::Mem | MemberKind::Null | MemberKind::Nbd | MemberKind::NvmeTcp => true,
        MemberKind::File => member
            .path()
            .is_some_and(|p| nvraid_io::sys::is_on_tmpfs(&p)),
        MemberKind::BlockDevice => member.path().is_some_and(|p| is_zram(&p)),
    }
}

fn is_zram(path: &Path) -> bool {
    std::fs::canonicalize(path)
        .ok()
        .and_then(|p| {
            p.file_name()
                .map(|n| n.to_string_lossy().starts_with("zram"))
        })
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvraid_member::OpenOptions;

    fn open(spec: &str) -> Member {
        Member::open(
            spec,
            OpenOptions {
                write: true,
                ..Default::default()
            },
        )
        .unwrap()
    }

    #[test]
    fn a_subject_line_names_level_members_and_chunk() {
        let members = vec!["m0".to_string(), "m1".to_string()];
        assert_eq!(
            subject_line("raid0", &members, Some(512 << 10)),
            "raid0, 2 members, chunk 512 KiB: m0, m1"
        );
        assert_eq!(
            subject_line("raid1", &members, None),
            "raid1, 2 members: m0, m1"
        );
    }

    #[test]
    fn auto_picks_psync_for_memory_and_uring_for_null_only() {
        let (mem, null) = (open("mem:1M"), open("null:1M"));
        assert_eq!(engine_for(Engine::Auto, &[&mem, &mem]), EngineKind::Psync);
        assert_eq!(engine_for(Engine::Auto, &[&null, &null]), EngineKind::Uring);
        assert_eq!(engine_for(Engine::Auto, &[&mem, &null]), EngineKind::Psync);
        assert_eq!(engine_for(Engine::Uring, &[&mem]), EngineKind::Uring);
        assert_eq!(engine_for(Engine::Psync, &[&null]), EngineKind::Psync);
    }
}
