//! The scalar reference kernels: byte by byte, obviously right; the SIMD
//! kernels are tested against these.

use crate::gf;

/// `dst ^= src`.
pub fn xor_into(dst: &mut [u8], src: &[u8]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d ^= s;
    }
}

/// P = XOR of the data blocks.
pub fn gen_p(data: &[&[u8]], p: &mut [u8]) {
    p.copy_from_slice(data[0]);
    for d in &data[1..] {
        xor_into(p, d);
    }
}

/// P = XOR of the data blocks, Q = Σ gⁱ·Dᵢ.
pub fn gen_pq(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
    for at in 0..p.len() {
        let mut pp = 0u8;
        let mut qq = 0u8;
        // Horner from the highest index down: Q = ((D[n-1]·g) ^ D[n-2])·g ...
        for d in data.iter().rev() {
            qq = gf::mul2(qq) ^ d[at];
            pp ^= d[at];
        }
        p[at] = pp;
        q[at] = qq;
    }
}

/// `dst = c · src`, or `dst ^= c · src` with `xor`.
pub fn mul_const(dst: &mut [u8], src: &[u8], c: u8, xor: bool) {
    for (d, s) in dst.iter_mut().zip(src) {
        let v = gf::mul(c, *s);
        *d = if xor { *d ^ v } else { v };
    }
}
