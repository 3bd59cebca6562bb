//! Random bytes from the kernel, for identities (array and device UUIDs,
//! a journal's first sequence number) and for data that must not compress
//! or read as holes (a benchmark's fill).

use std::io::Read;

/// Fill `buf` from `/dev/urandom`.
pub fn fill(buf: &mut [u8]) -> std::io::Result<()> {
    std::fs::File::open("/dev/urandom")?.read_exact(buf)
}

/// 16 random bytes: a UUID as md keeps them.
pub fn uuid() -> std::io::Result<[u8; 16]> {
    let mut uuid = [0u8; 16];
    fill(&mut uuid)?;
    Ok(uuid)
}

#[cfg(test)]
mod tests {
    #[test]
    fn two_uuids_differ() {
        let (a, b) = (super::uuid().unwrap(), super::uuid().unwrap());
        assert_ne!(a, b);
        assert_ne!(a, [0u8; 16]);
    }
}
