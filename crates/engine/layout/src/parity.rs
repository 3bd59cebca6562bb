//! md's RAID 4/5/6 stripe map: where a data chunk, its stripe's P and (RAID
//! 6) Q live, and in which order the data blocks enter Q.
//!
//! An array of `n` members with `k` parity blocks per stripe (1 or 2) has
//! `n - k` data chunks per stripe. Logical chunk `c` lies in stripe `c / (n
//! - k)` as data index `c % (n - k)`; every member holds one chunk of each
//! stripe, at `stripe × chunk` of its data area. The layout decides which
//! member holds P, Q and each data index (md's `raid5_compute_sector`):
//!
//! | layout (md number) | P of stripe s | data index d goes to |
//! |---|---|---|
//! | left-asymmetric (0) | n-1 - (s mod n) | d, skipping P (and Q) |
//! | right-asymmetric (1) | s mod n | d, skipping P (and Q) |
//! | left-symmetric (2) | n-1 - (s mod n) | the members after P (and Q), wrapping |
//! | right-symmetric (3) | s mod n | the members after P (and Q), wrapping |
//! | parity-first (4) | 0 (Q: 1) | d + k |
//! | parity-last (5) | n-k (Q: n-1) | d |
//! | `*-6` (16..=20) | the RAID 5 rule over the first n-1 members | Q is always the last member |
//!
//! (For RAID 5, n-1 - (s mod n) is md's `data_disks - s % n`.) On RAID 6 in
//! the rotating layouts Q follows P (to member 0 when P is last; the
//! asymmetric layouts then shift the data one member up). md computes Q over the data blocks in member order
//! starting after Q (wrapping): that order, not the logical one, gives each
//! block its power of g ([`StripeMap::q_slots`]).
//!
//! md's DDF layouts (8, 9, 10) are not supported: they order Q differently.

/// md's parity layouts nvraid knows (the `layout` word of the superblock).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ParityLayout {
    LeftAsymmetric,
    RightAsymmetric,
    LeftSymmetric,
    RightSymmetric,
    ParityFirst,
    ParityLast,
    /// RAID 6 only: a RAID 5 layout over the first n-1 members, Q last.
    Raid5With6(Raid5Rotation),
}

/// The RAID 5 rotations a `*-6` layout uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Raid5Rotation {
    LeftAsymmetric,
    RightAsymmetric,
    LeftSymmetric,
    RightSymmetric,
    ParityFirst,
}

impl ParityLayout {
    /// From md's layout number; `None` for numbers nvraid does not map.
    pub fn from_md(number: u32) -> Option<ParityLayout> {
        use ParityLayout::*;
        Some(match number {
            0 => LeftAsymmetric,
            1 => RightAsymmetric,
            2 => LeftSymmetric,
            3 => RightSymmetric,
            4 => ParityFirst,
            5 => ParityLast,
            16 => Raid5With6(Raid5Rotation::LeftAsymmetric),
            17 => Raid5With6(Raid5Rotation::RightAsymmetric),
            18 => Raid5With6(Raid5Rotation::LeftSymmetric),
            19 => Raid5With6(Raid5Rotation::RightSymmetric),
            20 => Raid5With6(Raid5Rotation::ParityFirst),
            _ => return None,
        })
    }

    /// md's layout number.
    pub fn to_md(self) -> u32 {
        use ParityLayout::*;
        match self {
            LeftAsymmetric => 0,
            RightAsymmetric => 1,
            LeftSymmetric => 2,
            RightSymmetric => 3,
            ParityFirst => 4,
            ParityLast => 5,
            Raid5With6(r) => 16 + r as u32,
        }
    }

    /// mdadm's name (`left-symmetric`, `parity-last`, `left-symmetric-6`...).
    /// From md's name (`left-symmetric`, ...; also mdadm's short forms `ls`,
    /// `la`, `rs`, `ra`); the `-6` forms only when `raid6`.
    pub fn from_name(name: &str, raid6: bool) -> Option<ParityLayout> {
        let name = match name {
            "ls" => "left-symmetric",
            "la" => "left-asymmetric",
            "rs" => "right-symmetric",
            "ra" => "right-asymmetric",
            other => other,
        };
        [0, 1, 2, 3, 4, 5, 16, 17, 18, 19, 20]
            .into_iter()
            .filter_map(ParityLayout::from_md)
            .filter(|l| raid6 || !matches!(l, ParityLayout::Raid5With6(_)))
            .find(|l| l.name() == name)
    }

    pub fn name(self) -> &'static str {
        use ParityLayout::*;
        match self {
            LeftAsymmetric => "left-asymmetric",
            RightAsymmetric => "right-asymmetric",
            LeftSymmetric => "left-symmetric",
            RightSymmetric => "right-symmetric",
            ParityFirst => "parity-first",
            ParityLast => "parity-last",
            Raid5With6(Raid5Rotation::LeftAsymmetric) => "left-asymmetric-6",
            Raid5With6(Raid5Rotation::RightAsymmetric) => "right-asymmetric-6",
            Raid5With6(Raid5Rotation::LeftSymmetric) => "left-symmetric-6",
            Raid5With6(Raid5Rotation::RightSymmetric) => "right-symmetric-6",
            Raid5With6(Raid5Rotation::ParityFirst) => "parity-first-6",
        }
    }
}

/// Where one stripe's blocks live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StripeBlocks {
    /// The member of each data index, in logical order.
    pub data: Vec<u32>,
    pub p: u32,
    /// RAID 6 only.
    pub q: Option<u32>,
}

/// The stripe map of a RAID 4/5/6 array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StripeMap {
    members: u32,
    /// 1 (RAID 4/5) or 2 (RAID 6).
    parity: u32,
    layout: ParityLayout,
}

/// Why a stripe map cannot be made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StripeMapError {
    TooFewMembers { members: u32, parity: u32 },
    LayoutNotForLevel(&'static str),
}

impl std::fmt::Display for StripeMapError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StripeMapError::TooFewMembers { members, parity } => write!(
                f,
                "{members} members are too few for {parity} parity chunk(s) per stripe (need at least {})",
                2 * parity
            ),
            StripeMapError::LayoutNotForLevel(name) => {
                write!(f, "layout {name} is for RAID 6 only")
            }
        }
    }
}

impl std::error::Error for StripeMapError {}

impl StripeMap {
    /// `parity`: 1 for RAID 4/5, 2 for RAID 6. md runs a RAID 5 of 2
    /// members (one data chunk per stripe, its parity a copy of it: what
    /// md's takeover of a two-member RAID 1 makes) and a RAID 6 of 4.
    pub fn new(members: u32, parity: u32, layout: ParityLayout) -> Result<Self, StripeMapError> {
        assert!(matches!(parity, 1 | 2), "parity blocks per stripe: 1 or 2");
        if members < 2 * parity {
            return Err(StripeMapError::TooFewMembers { members, parity });
        }
        if parity == 1 && matches!(layout, ParityLayout::Raid5With6(_)) {
            return Err(StripeMapError::LayoutNotForLevel(layout.name()));
        }
        Ok(StripeMap {
            members,
            parity,
            layout,
        })
    }

    pub fn data_per_stripe(&self) -> u32 {
        self.members - self.parity
    }

    /// Where stripe `stripe`'s data, P and Q live.
    pub fn stripe(&self, stripe: u64) -> StripeBlocks {
        let data_disks = self.data_per_stripe();
        let data = (0..data_disks).map(|d| self.place(stripe, d).0).collect();
        let (_, p, q) = self.place(stripe, 0);
        StripeBlocks { data, p, q }
    }

    /// The member holding data index `d` of stripe `stripe` (no allocation).
    pub fn data_member(&self, stripe: u64, d: u32) -> u32 {
        self.place(stripe, d).0
    }

    /// The members holding stripe `stripe`'s P and (RAID 6) Q.
    pub fn parity_members(&self, stripe: u64) -> (u32, Option<u32>) {
        let (_, p, q) = self.place(stripe, 0);
        (p, q)
    }

    /// RAID 6: data index `d`'s position in md's Q sum (one entry of
    /// [`StripeMap::q_slots`], without allocating); 0..n-2.
    pub fn q_slot(&self, stripe: u64, d: u32) -> usize {
        let (member, p, q) = self.place(stripe, d);
        let q = q.expect("a RAID 6 map");
        let n = self.members;
        // md's walk starts at the member after Q; P is skipped.
        let steps = (member + n - q - 1) % n;
        let p_at = (p + n - q - 1) % n;
        (if p_at < steps { steps - 1 } else { steps }) as usize
    }

    /// RAID 4/5/6: the number of members.
    pub fn members(&self) -> u32 {
        self.members
    }

    /// Parity blocks per stripe (1 or 2).
    pub fn parity(&self) -> u32 {
        self.parity
    }

    /// Logical chunk `chunk` → (stripe, member holding it).
    pub fn locate_chunk(&self, chunk: u64) -> (u64, u32) {
        let data_disks = u64::from(self.data_per_stripe());
        let stripe = chunk / data_disks;
        let (member, _, _) = self.place(stripe, (chunk % data_disks) as u32);
        (stripe, member)
    }

    /// md's `raid5_compute_sector`, for one stripe and data index: (the
    /// member holding it, P's member, Q's member).
    fn place(&self, stripe: u64, d: u32) -> (u32, u32, Option<u32>) {
        let n = self.members;
        let data_disks = self.data_per_stripe();
        let s = |m: u32| (stripe % u64::from(m)) as u32;
        use ParityLayout::*;
        if self.parity == 1 {
            return match self.layout {
                LeftAsymmetric => {
                    let p = data_disks - s(n);
                    (if d >= p { d + 1 } else { d }, p, None)
                }
                RightAsymmetric => {
                    let p = s(n);
                    (if d >= p { d + 1 } else { d }, p, None)
                }
                LeftSymmetric => {
                    let p = data_disks - s(n);
                    ((p + 1 + d) % n, p, None)
                }
                RightSymmetric => {
                    let p = s(n);
                    ((p + 1 + d) % n, p, None)
                }
                ParityFirst => (d + 1, 0, None),
                ParityLast => (d, data_disks, None),
                Raid5With6(_) => unreachable!("refused by new"),
            };
        }
        // RAID 6.
        let asymmetric = |p: u32| {
            if p == n - 1 {
                (d + 1, p, Some(0)) // Q D D D P
            } else {
                (if d >= p { d + 2 } else { d }, p, Some(p + 1)) // D D P Q D
            }
        };
        match self.layout {
            LeftAsymmetric => asymmetric(n - 1 - s(n)),
            RightAsymmetric => asymmetric(s(n)),
            LeftSymmetric => {
                let p = n - 1 - s(n);
                ((p + 2 + d) % n, p, Some((p + 1) % n))
            }
            RightSymmetric => {
                let p = s(n);
                ((p + 2 + d) % n, p, Some((p + 1) % n))
            }
            ParityFirst => (d + 2, 0, Some(1)),
            ParityLast => (d, data_disks, Some(data_disks + 1)),
            Raid5With6(rotation) => {
                let m = n - 1; // the RAID 5 part
                let q = Some(n - 1);
                match rotation {
                    Raid5Rotation::LeftAsymmetric => {
                        let p = data_disks - s(m);
                        (if d >= p { d + 1 } else { d }, p, q)
                    }
                    Raid5Rotation::RightAsymmetric => {
                        let p = s(m);
                        (if d >= p { d + 1 } else { d }, p, q)
                    }
                    Raid5Rotation::LeftSymmetric => {
                        let p = data_disks - s(m);
                        ((p + 1 + d) % m, p, q)
                    }
                    Raid5Rotation::RightSymmetric => {
                        let p = s(m);
                        ((p + 1 + d) % m, p, q)
                    }
                    Raid5Rotation::ParityFirst => (d + 1, 0, q),
                }
            }
        }
    }

    /// RAID 6: for each data index of stripe `stripe` (logical order), its
    /// position in md's Q sum (the power of g it is multiplied by): md walks
    /// the members from the one after Q, wrapping, skipping P and Q.
    pub fn q_slots(&self, stripe: u64) -> Vec<usize> {
        let blocks = self.stripe(stripe);
        let q = blocks.q.expect("a RAID 6 map");
        let n = self.members;
        let mut slot_of_member = vec![usize::MAX; n as usize];
        let mut next = 0;
        for step in 1..=n {
            let member = (q + step) % n;
            if member != blocks.p && member != q {
                slot_of_member[member as usize] = next;
                next += 1;
            }
        }
        blocks
            .data
            .iter()
            .map(|m| slot_of_member[*m as usize])
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// md's own comments draw these (raid5.c): left-symmetric RAID 5 over
    /// 4 members puts P on 3, 2, 1, 0 and data after it.
    #[test]
    fn left_symmetric_raid5_rotates_as_md_draws_it() {
        let map = StripeMap::new(4, 1, ParityLayout::LeftSymmetric).unwrap();
        assert_eq!(map.stripe(0).data, vec![0, 1, 2]);
        assert_eq!(map.stripe(0).p, 3);
        assert_eq!(map.stripe(1).data, vec![3, 0, 1]);
        assert_eq!(map.stripe(1).p, 2);
        assert_eq!(map.stripe(3).p, 0);
        assert_eq!(map.stripe(3).data, vec![1, 2, 3]);
        assert_eq!(map.stripe(4), map.stripe(0));
    }

    /// md's RAID 5 of two members (its RAID 1 takeover): each stripe is
    /// one data chunk and its parity on the other member, for every
    /// RAID 5 layout; a RAID 6 still needs four.
    #[test]
    fn a_two_member_raid5_holds_each_chunk_and_its_parity_on_both_members() {
        for number in [0, 1, 2, 3, 4, 5] {
            let layout = ParityLayout::from_md(number).unwrap();
            let map = StripeMap::new(2, 1, layout).unwrap();
            for stripe in 0..6 {
                let blocks = map.stripe(stripe);
                assert_eq!(blocks.data.len(), 1);
                assert_ne!(blocks.data[0], blocks.p, "{layout:?} stripe {stripe}");
                assert!(blocks.data[0] < 2 && blocks.p < 2);
            }
        }
        // Left-symmetric, md's choice: P on member 1, then 0, alternating.
        let map = StripeMap::new(2, 1, ParityLayout::LeftSymmetric).unwrap();
        assert_eq!((map.stripe(0).data[0], map.stripe(0).p), (0, 1));
        assert_eq!((map.stripe(1).data[0], map.stripe(1).p), (1, 0));
        assert!(StripeMap::new(1, 1, ParityLayout::LeftSymmetric).is_err());
        assert!(StripeMap::new(3, 2, ParityLayout::LeftSymmetric).is_err());
    }

    #[test]
    fn every_stripe_uses_every_member_once() {
        for parity in 1..=2 {
            for n in parity + 2..=8 {
                for number in [0, 1, 2, 3, 4, 5, 16, 17, 18, 19, 20] {
                    let layout = ParityLayout::from_md(number).unwrap();
                    let Ok(map) = StripeMap::new(n, parity, layout) else {
                        assert!(parity == 1 && number >= 16);
                        continue;
                    };
                    for stripe in 0..2 * u64::from(n) {
                        let b = map.stripe(stripe);
                        let mut all: Vec<u32> = b.data.clone();
                        all.push(b.p);
                        all.extend(b.q);
                        all.sort();
                        assert_eq!(
                            all,
                            (0..n).collect::<Vec<_>>(),
                            "{layout:?} n={n} s={stripe}"
                        );
                        if parity == 2 {
                            let each: Vec<usize> =
                                (0..n - 2).map(|d| map.q_slot(stripe, d)).collect();
                            assert_eq!(each, map.q_slots(stripe), "{layout:?} n={n} s={stripe}");
                            let mut slots = map.q_slots(stripe);
                            slots.sort();
                            assert_eq!(slots, (0..(n - 2) as usize).collect::<Vec<_>>());
                        }
                    }
                    assert_eq!(ParityLayout::from_md(layout.to_md()), Some(layout));
                }
            }
        }
    }

    #[test]
    fn raid6_q_follows_p_and_symmetric_slots_are_logical() {
        let map = StripeMap::new(5, 2, ParityLayout::LeftSymmetric).unwrap();
        let s0 = map.stripe(0);
        assert_eq!((s0.p, s0.q), (4, Some(0)));
        assert_eq!(s0.data, vec![1, 2, 3]);
        for stripe in 0..10 {
            assert_eq!(map.q_slots(stripe), vec![0, 1, 2]);
        }
        // Left-asymmetric, stripe 2 of 5: P on 2, Q on 3, data on 0, 1, 4;
        // md's Q walk starts after Q: member 4 (data index 2) comes first.
        let la = StripeMap::new(5, 2, ParityLayout::LeftAsymmetric).unwrap();
        assert_eq!(la.stripe(2).data, vec![0, 1, 4]);
        assert_eq!(la.q_slots(2), vec![1, 2, 0]);
        assert!(StripeMap::new(3, 2, ParityLayout::LeftSymmetric).is_err());
    }
}
