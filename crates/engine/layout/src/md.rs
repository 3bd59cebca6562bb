//! A level in md's words: the superblock's level and layout numbers (both
//! ways), the layout's name as `detail` and `examine` show it, and the
//! layout names the command line's `--layout` takes.
//!
//! md's layout word for each level nvraid knows:
//!
//! | level | layout word |
//! |---|---|
//! | raid0 | 1 (md's "original" zone layout, what mdadm records for one zone); any word is read |
//! | raid1 | 0; any word is read |
//! | raid10 | near copies in bits 0-7, far copies in bits 8-15, the offset flag in bit 16, the far-set version above (0): `n2` = 0x102, `f2` = 0x201, `o2` = 0x10201 |
//! | raid4 | any word is read (parity is always on the last member); nvraid writes md's raid5 with layout 5 (parity-last) |
//! | raid5, raid6 | the parity layout's number ([`ParityLayout::from_md`]); the `-6` layouts (16..=20) on raid6 only |

use crate::parity::ParityLayout;
use crate::Level;

/// Why md's level and layout numbers name no level nvraid supports. The
/// text names the number that is not supported.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MdLevelError {
    #[error("raid level {0}")]
    Level(i32),
    #[error(
        "raid10 layout {0:#x} (nvraid reads md's near, far and offset layouts with one kind of \
         copy, in the original far-set version: nN, fN, oN)"
    )]
    Raid10Layout(u32),
    #[error(
        "raid{level} layout {layout} (nvraid reads md's left/right symmetric/asymmetric, \
         parity-first and parity-last layouts, and the -6 variants on raid6; not the DDF ones)"
    )]
    ParityLayout { level: i32, layout: u32 },
}

impl Level {
    /// The level md's superblock describes with `level` and `layout`.
    pub fn from_md(level: i32, layout: u32) -> Result<Level, MdLevelError> {
        match level {
            0 => Ok(Level::Raid0),
            1 => Ok(Level::Raid1),
            10 => {
                let near = layout & 0xff;
                let far = (layout >> 8) & 0xff;
                let offset = layout & (1 << 16) != 0;
                match (near, far, offset, layout >> 17) {
                    (near, 1, false, 0) => Ok(Level::Raid10 { near }),
                    (1, copies, offset, 0) if copies >= 2 => {
                        Ok(Level::Raid10Far { copies, offset })
                    }
                    _ => Err(MdLevelError::Raid10Layout(layout)),
                }
            }
            // RAID 4 keeps parity on the last member whatever the layout
            // word says (md ignores it too).
            4 => Ok(Level::Raid5 {
                layout: ParityLayout::ParityLast,
            }),
            5 | 6 => {
                let parity = ParityLayout::from_md(layout)
                    .filter(|l| level == 6 || !matches!(l, ParityLayout::Raid5With6(_)))
                    .ok_or(MdLevelError::ParityLayout { level, layout })?;
                Ok(if level == 5 {
                    Level::Raid5 { layout: parity }
                } else {
                    Level::Raid6 { layout: parity }
                })
            }
            other => Err(MdLevelError::Level(other)),
        }
    }

    /// md's layout word for the level, as nvraid writes it (the inverse of
    /// [`Level::from_md`] with [`Level::number`]).
    pub fn md_layout(self) -> u32 {
        match self {
            Level::Raid0 => 1,
            Level::Raid1 => 0,
            Level::Raid10 { near } => (1 << 8) | near,
            Level::Raid10Far { copies, offset } => (u32::from(offset) << 16) | (copies << 8) | 1,
            Level::Raid5 { layout } | Level::Raid6 { layout } => layout.to_md(),
        }
    }

    /// The layout as `detail` and `examine` name it: `near=2`, `far=2`,
    /// `offset=3` for RAID 10, mdadm's names (`left-symmetric`, ...) for
    /// RAID 4/5/6; `None` for the levels without a layout (RAID 0 and 1).
    pub fn layout_name(self) -> Option<String> {
        match self {
            Level::Raid0 | Level::Raid1 => None,
            Level::Raid10 { near } => Some(format!("near={near}")),
            Level::Raid10Far {
                copies,
                offset: false,
            } => Some(format!("far={copies}")),
            Level::Raid10Far {
                copies,
                offset: true,
            } => Some(format!("offset={copies}")),
            Level::Raid5 { layout } | Level::Raid6 { layout } => Some(layout.name().to_string()),
        }
    }

    /// The level with the layout the command line names in place of its
    /// own: `nN`, `fN` or `oN` (N copies) for RAID 10; md's parity layout
    /// names for RAID 5 and 6 (`left-symmetric`, ..., the short `ls`, `la`,
    /// `rs`, `ra`; the `-6` forms on RAID 6 only). RAID 0, RAID 1 and RAID 4
    /// (RAID 5 with its parity on the last member) take no layout. The copy
    /// count is checked where the members are known ([`crate::Geometry::new`]).
    pub fn with_layout(self, text: &str) -> Result<Level, String> {
        match self {
            Level::Raid10 { .. } | Level::Raid10Far { .. } => {
                let bad = || {
                    format!(
                        "unknown raid10 layout {text:?}: use nN (near), fN (far) or oN \
                         (offset), e.g. n2, f2, o2"
                    )
                };
                let (kind, copies) = text.split_at(text.len().min(1));
                let copies: u32 = copies.parse().map_err(|_| bad())?;
                match kind {
                    "n" => Ok(Level::Raid10 { near: copies }),
                    "f" => Ok(Level::Raid10Far {
                        copies,
                        offset: false,
                    }),
                    "o" => Ok(Level::Raid10Far {
                        copies,
                        offset: true,
                    }),
                    _ => Err(bad()),
                }
            }
            Level::Raid5 {
                layout: ParityLayout::ParityLast,
            } => Err(
                "a layout does not apply to raid4 (its parity is always on the last member)".into(),
            ),
            Level::Raid5 { .. } | Level::Raid6 { .. } => {
                let raid6 = matches!(self, Level::Raid6 { .. });
                let layout = ParityLayout::from_name(text, raid6).ok_or_else(|| {
                    format!(
                        "unknown {} layout {text:?}: use left-symmetric (ls), left-asymmetric \
                         (la), right-symmetric (rs), right-asymmetric (ra), parity-first or \
                         parity-last{}",
                        self.md_name(),
                        if raid6 {
                            ", or a -6 form (left-symmetric-6, ...)"
                        } else {
                            ""
                        }
                    )
                })?;
                Ok(if raid6 {
                    Level::Raid6 { layout }
                } else {
                    Level::Raid5 { layout }
                })
            }
            Level::Raid0 | Level::Raid1 => Err(format!(
                "a layout does not apply to {} (layouts are for raid10, raid5 and raid6 only)",
                self.md_name()
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parity::Raid5Rotation;

    /// Every level nvraid writes: RAID 0 and 1, RAID 10 near/far/offset with
    /// 2..=4 copies, RAID 5 in its six layouts, RAID 6 in all eleven.
    fn every_level() -> Vec<Level> {
        let mut levels = vec![Level::Raid0, Level::Raid1];
        for copies in 2..=4 {
            levels.push(Level::Raid10 { near: copies });
            for offset in [false, true] {
                levels.push(Level::Raid10Far { copies, offset });
            }
        }
        for number in 0..=20 {
            if let Some(layout) = ParityLayout::from_md(number) {
                if !matches!(layout, ParityLayout::Raid5With6(_)) {
                    levels.push(Level::Raid5 { layout });
                }
                levels.push(Level::Raid6 { layout });
            }
        }
        levels
    }

    #[test]
    fn every_level_round_trips_through_mds_numbers() {
        let levels = every_level();
        assert_eq!(levels.len(), 2 + 9 + 6 + 11);
        for level in levels {
            let number = i32::try_from(level.number()).unwrap();
            assert_eq!(
                Level::from_md(number, level.md_layout()),
                Ok(level),
                "{level}"
            );
        }
    }

    #[test]
    fn mds_layout_words_are_the_documented_ones() {
        assert_eq!(Level::Raid0.md_layout(), 1);
        assert_eq!(Level::Raid1.md_layout(), 0);
        assert_eq!(Level::Raid10 { near: 2 }.md_layout(), 0x102);
        assert_eq!(Level::Raid10 { near: 3 }.md_layout(), 0x103);
        let far = |copies, offset| Level::Raid10Far { copies, offset }.md_layout();
        assert_eq!(far(2, false), 0x201);
        assert_eq!(far(3, false), 0x301);
        assert_eq!(far(2, true), 0x10201);
        assert_eq!(far(4, true), 0x10401);
        let raid5 = |layout| Level::Raid5 { layout }.md_layout();
        assert_eq!(raid5(ParityLayout::LeftSymmetric), 2);
        assert_eq!(raid5(ParityLayout::ParityLast), 5);
        let raid6 = Level::Raid6 {
            layout: ParityLayout::Raid5With6(Raid5Rotation::ParityFirst),
        };
        assert_eq!(raid6.md_layout(), 20);
    }

    #[test]
    fn raid0_raid1_and_raid4_read_any_layout_word() {
        for word in [0, 1, 2, 0x102, u32::MAX] {
            assert_eq!(Level::from_md(0, word), Ok(Level::Raid0));
            assert_eq!(Level::from_md(1, word), Ok(Level::Raid1));
            assert_eq!(
                Level::from_md(4, word),
                Ok(Level::Raid5 {
                    layout: ParityLayout::ParityLast
                })
            );
        }
    }

    #[test]
    fn unsupported_numbers_are_named() {
        let text = |level, layout| Level::from_md(level, layout).unwrap_err().to_string();
        assert_eq!(text(7, 0), "raid level 7");
        assert_eq!(text(-1, 0), "raid level -1");
        // Near and far copies together, no far word, the newer far sets,
        // the offset flag on near copies. (One near copy, 0x101, decodes;
        // `Geometry::new` refuses it for its copy count.)
        for word in [0x202, 0x1, 0x0, 0x20201, 0x10102] {
            let message = text(10, word);
            assert!(
                message.starts_with(&format!("raid10 layout {word:#x} ")),
                "{message}"
            );
        }
        // DDF layouts, and the -6 forms on RAID 5.
        for (level, word) in [(5, 8), (6, 9), (5, 10), (5, 16), (5, 20), (6, 21)] {
            let message = text(level, word);
            assert!(
                message.starts_with(&format!("raid{level} layout {word} ")),
                "{message}"
            );
            assert!(message.contains("not the DDF ones"), "{message}");
        }
    }

    #[test]
    fn layout_names_are_what_detail_shows() {
        assert_eq!(Level::Raid0.layout_name(), None);
        assert_eq!(Level::Raid1.layout_name(), None);
        let name = |level: Level| level.layout_name().unwrap();
        assert_eq!(name(Level::Raid10 { near: 2 }), "near=2");
        assert_eq!(
            name(Level::Raid10Far {
                copies: 3,
                offset: false
            }),
            "far=3"
        );
        assert_eq!(
            name(Level::Raid10Far {
                copies: 2,
                offset: true
            }),
            "offset=2"
        );
        assert_eq!(
            name(Level::Raid5 {
                layout: ParityLayout::ParityLast
            }),
            "parity-last"
        );
        assert_eq!(
            name(Level::Raid6 {
                layout: ParityLayout::Raid5With6(Raid5Rotation::LeftSymmetric)
            }),
            "left-symmetric-6"
        );
    }

    #[test]
    fn every_layout_name_is_taken_back_by_with_layout() {
        // What `detail` shows and what `--layout` takes are md's names, so
        // every level's layout written as --layout gives the level back.
        for level in every_level() {
            let text = match level {
                Level::Raid0 | Level::Raid1 => continue,
                Level::Raid10 { near } => format!("n{near}"),
                Level::Raid10Far { copies, offset } => {
                    format!("{}{copies}", if offset { 'o' } else { 'f' })
                }
                _ => level.layout_name().unwrap(),
            };
            let base = Level::parse(&level.number().to_string()).unwrap();
            assert_eq!(base.with_layout(&text), Ok(level), "{text}");
        }
    }

    #[test]
    fn with_layout_takes_mdadms_short_names() {
        let raid5 = Level::parse("5").unwrap();
        for (short, layout) in [
            ("ls", ParityLayout::LeftSymmetric),
            ("la", ParityLayout::LeftAsymmetric),
            ("rs", ParityLayout::RightSymmetric),
            ("ra", ParityLayout::RightAsymmetric),
        ] {
            assert_eq!(raid5.with_layout(short), Ok(Level::Raid5 { layout }));
        }
    }

    #[test]
    fn with_layout_refuses_by_name() {
        let refused = |level: &str, layout: &str| {
            Level::parse(level)
                .unwrap()
                .with_layout(layout)
                .unwrap_err()
        };
        assert!(refused("10", "x2").starts_with("unknown raid10 layout \"x2\""));
        assert!(refused("10", "n").starts_with("unknown raid10 layout \"n\""));
        assert!(refused("10", "").starts_with("unknown raid10 layout \"\""));
        assert!(refused("5", "diagonal").starts_with("unknown raid5 layout \"diagonal\""));
        assert!(refused("5", "left-symmetric-6").starts_with("unknown raid5 layout"));
        assert!(refused("6", "diagonal").contains("a -6 form"));
        assert!(refused("4", "ls").contains("raid4"));
        assert!(refused("0", "n2").contains("raid0"));
        assert!(refused("1", "n2").contains("raid1"));
    }
}
