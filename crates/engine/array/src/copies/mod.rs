//! The copies family: RAID 0, 1 and 10. Data is striped in chunks over the
//! members, and each chunk is kept `copies` times on different members
//! (RAID 0: once; RAID 1: on every member; RAID 10: near/far/offset
//! copies). Whatever one copy cannot give, another can.
//!
//! | file | what it holds |
//! |---|---|
//! | [`simple`] | the simple path: read balancing over the copies, reading around bad blocks and recovery points, writing every copy, failover |
//! | [`scrub`] | comparing and repairing the copies, and rebuilding a member from them |
//!
//! | [`fast`] | the fast path: split, copy choice and reissue on a fanout queue (its queue in [`crate::fanout`]) |
//!
//! The fast path's copy choice shares [`simple::least_loaded_copy`] with the
//! simple path.

pub(crate) mod fast;
pub(crate) mod scrub;
pub(crate) mod simple;
