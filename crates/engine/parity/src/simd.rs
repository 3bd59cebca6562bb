//! SIMD kernels for x86-64: AVX2 (32 bytes a step) and AVX-512BW (64),
//! chosen at run time. Each handles the whole 32/64-byte steps of a block
//! and leaves the tail to the scalar kernel.
//!
//! - Multiplying every byte by 2 in GF(2⁸): add the byte to itself (a shift
//!   left) and XOR 0x1d into the bytes whose top bit was set (a signed
//!   compare with zero gives that mask).
//! - Multiplying every byte by a constant c: split each byte into nibbles
//!   and look both up in 16-entry tables of c·lo and c·(hi << 4) with a byte
//!   shuffle (`pshufb`), then XOR the two.

use crate::{gf, scalar, Kernel};

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

pub fn available() -> Vec<Kernel> {
    let mut all = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2") {
            all.push(Kernel::Avx2);
        }
        if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") {
            all.push(Kernel::Avx512);
        }
    }
    all
}

pub fn best() -> Kernel {
    static BEST: std::sync::OnceLock<Kernel> = std::sync::OnceLock::new();
    *BEST.get_or_init(|| available().last().copied().unwrap_or(Kernel::Scalar))
}

/// Whether the CPU has `kernel`'s instructions (detected once; the data
/// path asks per block and must not allocate).
fn has(kernel: Kernel) -> bool {
    static AVAILABLE: std::sync::OnceLock<Vec<Kernel>> = std::sync::OnceLock::new();
    kernel == Kernel::Scalar || AVAILABLE.get_or_init(available).contains(&kernel)
}

/// A kernel the CPU was checked to have.
fn checked(kernel: Kernel) -> Kernel {
    assert!(
        has(kernel),
        "{} is not available on this CPU",
        kernel.name()
    );
    kernel
}

pub fn xor_into(kernel: Kernel, dst: &mut [u8], src: &[u8]) {
    let done = match checked(kernel) {
        // SAFETY: `checked` confirmed the CPU has the instructions.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => unsafe { xor_avx2(dst, src) },
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 => unsafe { xor_avx512(dst, src) },
        _ => 0,
    };
    scalar::xor_into(&mut dst[done..], &src[done..]);
}

/// P alone, in one pass over the data (no read-modify-write of P per block).
pub fn gen_p(kernel: Kernel, data: &[&[u8]], p: &mut [u8]) {
    let done = match checked(kernel) {
        // SAFETY: as above; every block is at least `p.len()` long.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => unsafe { gen_p_avx2(data, p) },
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 => unsafe { gen_p_avx512(data, p) },
        _ => 0,
    };
    if done < p.len() {
        // A tail the vector loop left (widths not a multiple of its step;
        // nvraid's are multiples of 512, so never on the data path).
        let tails: Vec<&[u8]> = data.iter().map(|d| &d[done..]).collect();
        scalar::gen_p(&tails, &mut p[done..]);
    }
}

pub fn gen_pq(kernel: Kernel, data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
    let done = match checked(kernel) {
        // SAFETY: as above; every block is at least `p.len()` long.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => unsafe { gen_pq_avx2(data, p, q) },
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 => unsafe { gen_pq_avx512(data, p, q) },
        _ => 0,
    };
    if done < p.len() {
        // As in `gen_p`: only a tail the vector loop left.
        let tails: Vec<&[u8]> = data.iter().map(|d| &d[done..]).collect();
        scalar::gen_pq(&tails, &mut p[done..], &mut q[done..]);
    }
}

pub fn mul_const(kernel: Kernel, dst: &mut [u8], src: &[u8], c: u8, xor: bool) {
    let (lo, hi) = nibble_tables(c);
    let done = match checked(kernel) {
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => unsafe { mul_avx2(dst, src, &lo, &hi, xor) },
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 => unsafe { mul_avx512(dst, src, &lo, &hi, xor) },
        _ => 0,
    };
    scalar::mul_const(&mut dst[done..], &src[done..], c, xor);
}

/// `c · n` for every low nibble n, and `c · (n << 4)` for every high one.
fn nibble_tables(c: u8) -> ([u8; 16], [u8; 16]) {
    let mut lo = [0u8; 16];
    let mut hi = [0u8; 16];
    for n in 0..16u8 {
        lo[n as usize] = gf::mul(c, n);
        hi[n as usize] = gf::mul(c, n << 4);
    }
    (lo, hi)
}

// SAFETY (every function below): callers check the target feature first;
// loads and stores are unaligned and stay inside `[0, len - len % step)` of
// slices at least that long.

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn xor_avx2(dst: &mut [u8], src: &[u8]) -> usize {
    let end = dst.len() - dst.len() % 32;
    let mut i = 0;
    while i < end {
        let d = _mm256_loadu_si256(dst.as_ptr().add(i).cast());
        let s = _mm256_loadu_si256(src.as_ptr().add(i).cast());
        _mm256_storeu_si256(dst.as_mut_ptr().add(i).cast(), _mm256_xor_si256(d, s));
        i += 32;
    }
    end
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn xor_avx512(dst: &mut [u8], src: &[u8]) -> usize {
    let end = dst.len() - dst.len() % 64;
    let mut i = 0;
    while i < end {
        let d = _mm512_loadu_si512(dst.as_ptr().add(i).cast());
        let s = _mm512_loadu_si512(src.as_ptr().add(i).cast());
        _mm512_storeu_si512(dst.as_mut_ptr().add(i).cast(), _mm512_xor_si512(d, s));
        i += 64;
    }
    end
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn gen_p_avx2(data: &[&[u8]], p: &mut [u8]) -> usize {
    let end = p.len() - p.len() % 32;
    let mut i = 0;
    while i < end {
        let mut pp = _mm256_loadu_si256(data[0].as_ptr().add(i).cast());
        for d in &data[1..] {
            pp = _mm256_xor_si256(pp, _mm256_loadu_si256(d.as_ptr().add(i).cast()));
        }
        _mm256_storeu_si256(p.as_mut_ptr().add(i).cast(), pp);
        i += 32;
    }
    end
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn gen_p_avx512(data: &[&[u8]], p: &mut [u8]) -> usize {
    // Two vectors a step: more loads in flight per data block.
    let pairs = p.len() - p.len() % 128;
    let mut i = 0;
    while i < pairs {
        let mut a = _mm512_loadu_si512(data[0].as_ptr().add(i).cast());
        let mut b = _mm512_loadu_si512(data[0].as_ptr().add(i + 64).cast());
        for d in &data[1..] {
            a = _mm512_xor_si512(a, _mm512_loadu_si512(d.as_ptr().add(i).cast()));
            b = _mm512_xor_si512(b, _mm512_loadu_si512(d.as_ptr().add(i + 64).cast()));
        }
        _mm512_storeu_si512(p.as_mut_ptr().add(i).cast(), a);
        _mm512_storeu_si512(p.as_mut_ptr().add(i + 64).cast(), b);
        i += 128;
    }
    let end = p.len() - p.len() % 64;
    while i < end {
        let mut pp = _mm512_loadu_si512(data[0].as_ptr().add(i).cast());
        for d in &data[1..] {
            pp = _mm512_xor_si512(pp, _mm512_loadu_si512(d.as_ptr().add(i).cast()));
        }
        _mm512_storeu_si512(p.as_mut_ptr().add(i).cast(), pp);
        i += 64;
    }
    end
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn gen_pq_avx2(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) -> usize {
    let end = p.len() - p.len() % 32;
    let poly = _mm256_set1_epi8(gf::POLY as i8);
    let zero = _mm256_setzero_si256();
    let top = data.len() - 1;
    let mut i = 0;
    while i < end {
        let mut pp = _mm256_loadu_si256(data[top].as_ptr().add(i).cast());
        let mut qq = pp;
        for d in data[..top].iter().rev() {
            let v = _mm256_loadu_si256(d.as_ptr().add(i).cast());
            // qq · 2: shift left, reduce where the top bit was set.
            let high = _mm256_cmpgt_epi8(zero, qq);
            qq = _mm256_xor_si256(_mm256_add_epi8(qq, qq), _mm256_and_si256(high, poly));
            qq = _mm256_xor_si256(qq, v);
            pp = _mm256_xor_si256(pp, v);
        }
        _mm256_storeu_si256(p.as_mut_ptr().add(i).cast(), pp);
        _mm256_storeu_si256(q.as_mut_ptr().add(i).cast(), qq);
        i += 32;
    }
    end
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn gen_pq_avx512(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) -> usize {
    let end = p.len() - p.len() % 64;
    let poly = _mm512_set1_epi8(gf::POLY as i8);
    let zero = _mm512_setzero_si512();
    let top = data.len() - 1;
    let mut i = 0;
    while i < end {
        let mut pp = _mm512_loadu_si512(data[top].as_ptr().add(i).cast());
        let mut qq = pp;
        for d in data[..top].iter().rev() {
            let v = _mm512_loadu_si512(d.as_ptr().add(i).cast());
            // qq · 2: shift left, reduce where the top bit was set.
            let high = _mm512_cmplt_epi8_mask(qq, zero);
            let reduce = _mm512_maskz_mov_epi8(high, poly);
            qq = _mm512_xor_si512(_mm512_add_epi8(qq, qq), reduce);
            qq = _mm512_xor_si512(qq, v);
            pp = _mm512_xor_si512(pp, v);
        }
        _mm512_storeu_si512(p.as_mut_ptr().add(i).cast(), pp);
        _mm512_storeu_si512(q.as_mut_ptr().add(i).cast(), qq);
        i += 64;
    }
    end
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn mul_avx2(dst: &mut [u8], src: &[u8], lo: &[u8; 16], hi: &[u8; 16], xor: bool) -> usize {
    let end = dst.len() - dst.len() % 32;
    let lo = _mm256_broadcastsi128_si256(_mm_loadu_si128(lo.as_ptr().cast()));
    let hi = _mm256_broadcastsi128_si256(_mm_loadu_si128(hi.as_ptr().cast()));
    let mask = _mm256_set1_epi8(0x0f);
    let mut i = 0;
    while i < end {
        let s = _mm256_loadu_si256(src.as_ptr().add(i).cast());
        let low = _mm256_and_si256(s, mask);
        let high = _mm256_and_si256(_mm256_srli_epi64(s, 4), mask);
        let mut v = _mm256_xor_si256(_mm256_shuffle_epi8(lo, low), _mm256_shuffle_epi8(hi, high));
        if xor {
            v = _mm256_xor_si256(v, _mm256_loadu_si256(dst.as_ptr().add(i).cast()));
        }
        _mm256_storeu_si256(dst.as_mut_ptr().add(i).cast(), v);
        i += 32;
    }
    end
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn mul_avx512(dst: &mut [u8], src: &[u8], lo: &[u8; 16], hi: &[u8; 16], xor: bool) -> usize {
    let end = dst.len() - dst.len() % 64;
    let lo = _mm512_broadcast_i32x4(_mm_loadu_si128(lo.as_ptr().cast()));
    let hi = _mm512_broadcast_i32x4(_mm_loadu_si128(hi.as_ptr().cast()));
    let mask = _mm512_set1_epi8(0x0f);
    let mut i = 0;
    while i < end {
        let s = _mm512_loadu_si512(src.as_ptr().add(i).cast());
        let low = _mm512_and_si512(s, mask);
        let high = _mm512_and_si512(_mm512_srli_epi64(s, 4), mask);
        let mut v = _mm512_xor_si512(_mm512_shuffle_epi8(lo, low), _mm512_shuffle_epi8(hi, high));
        if xor {
            v = _mm512_xor_si512(v, _mm512_loadu_si512(dst.as_ptr().add(i).cast()));
        }
        _mm512_storeu_si512(dst.as_mut_ptr().add(i).cast(), v);
        i += 64;
    }
    end
}
