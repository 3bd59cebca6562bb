//! nvraid-parity: the parity of md's RAID 5 and RAID 6, pure and fast.
//!
//! - **P** is the XOR of the data blocks (RAID 5's parity, RAID 6's first).
//! - **Q** is Σ gⁱ·Dᵢ over GF(2⁸) with md's polynomial 0x11d and g = 2,
//!   where *i* is the data block's index in md's order ([`gf`]).
//!
//! Generation and the recovery of any one or two lost blocks of a stripe
//! (data, data+data, data+P, data+Q, P+Q) are built from three kernels:
//! XOR into, P+Q generation (Horner's rule: `Q = ((D[n-1]·2 ^ D[n-2])·2 ^
//! ...) ^ D[0]`), and multiplication of a block by a constant. Each has a
//! scalar reference ([`scalar`]) and SIMD versions (AVX2, AVX-512BW) chosen
//! at run time; the property tests check that every path agrees with the
//! scalar one for every case. No I/O, no allocation on the hot paths (the
//! recovery of two data blocks allocates two scratch blocks).

pub mod gf;
pub mod scalar;
mod simd;

/// Which implementation the kernels use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    Scalar,
    Avx2,
    Avx512,
}

impl Kernel {
    /// The fastest the CPU has.
    pub fn best() -> Kernel {
        simd::best()
    }

    /// Every kernel this CPU can run (for tests and benchmarks).
    pub fn available() -> Vec<Kernel> {
        let mut all = vec![Kernel::Scalar];
        all.extend(simd::available());
        all
    }

    pub fn name(self) -> &'static str {
        match self {
            Kernel::Scalar => "scalar",
            Kernel::Avx2 => "avx2",
            Kernel::Avx512 => "avx512bw",
        }
    }
}

fn same_len(blocks: &[&[u8]], len: usize) {
    assert!(
        blocks.iter().all(|b| b.len() == len),
        "parity blocks must all have the same length"
    );
}

/// `dst ^= src`.
pub fn xor_into(kernel: Kernel, dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "xor of blocks of different lengths");
    match kernel {
        Kernel::Scalar => scalar::xor_into(dst, src),
        k => simd::xor_into(k, dst, src),
    }
}

/// RAID 5: `p` = XOR of `data`.
pub fn gen_p(kernel: Kernel, data: &[&[u8]], p: &mut [u8]) {
    same_len(data, p.len());
    assert!(!data.is_empty(), "at least one data block");
    match kernel {
        Kernel::Scalar => scalar::gen_p(data, p),
        k => simd::gen_p(k, data, p),
    }
}

/// RAID 6: `p` and `q` of `data` (md's order: `data[0]` is D₀).
pub fn gen_pq(kernel: Kernel, data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
    same_len(data, p.len());
    assert_eq!(p.len(), q.len(), "P and Q of different lengths");
    assert!(!data.is_empty(), "at least one data block");
    match kernel {
        Kernel::Scalar => scalar::gen_pq(data, p, q),
        k => simd::gen_pq(k, data, p, q),
    }
}

/// `dst = c · src` (`xor`: `dst ^= c · src`).
pub fn mul_const(kernel: Kernel, dst: &mut [u8], src: &[u8], c: u8, xor: bool) {
    assert_eq!(dst.len(), src.len(), "blocks of different lengths");
    match kernel {
        Kernel::Scalar => scalar::mul_const(dst, src, c, xor),
        k => simd::mul_const(k, dst, src, c, xor),
    }
}

/// One stripe of a RAID 6 (or RAID 5 with `q: None`): `n` data blocks, P,
/// and Q, some of them lost. [`Stripe::recover`] rebuilds the lost ones in
/// place.
pub struct Stripe<'a> {
    pub data: Vec<&'a mut [u8]>,
    pub p: &'a mut [u8],
    pub q: Option<&'a mut [u8]>,
}

/// A block of a stripe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Block {
    Data(usize),
    P,
    Q,
}

/// Why a stripe cannot be recovered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecoverError {
    /// More blocks lost than the parity covers (RAID 5: 1, RAID 6: 2).
    TooMany(Vec<Block>),
    /// A block named that the stripe does not have.
    NoSuchBlock(Block),
}

impl std::fmt::Display for RecoverError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecoverError::TooMany(lost) => write!(f, "{lost:?} lost: more than the parity covers"),
            RecoverError::NoSuchBlock(b) => write!(f, "the stripe has no block {b:?}"),
        }
    }
}

impl std::error::Error for RecoverError {}

impl Stripe<'_> {
    /// Rebuild the blocks in `lost` (their contents are ignored and
    /// overwritten) from the others.
    pub fn recover(&mut self, kernel: Kernel, lost: &[Block]) -> Result<(), RecoverError> {
        let n = self.data.len();
        let mut lost = lost.to_vec();
        lost.sort();
        lost.dedup();
        for b in &lost {
            let exists = match b {
                Block::Data(i) => *i < n,
                Block::P => true,
                Block::Q => self.q.is_some(),
            };
            if !exists {
                return Err(RecoverError::NoSuchBlock(*b));
            }
        }
        let covers = if self.q.is_some() { 2 } else { 1 };
        if lost.len() > covers {
            return Err(RecoverError::TooMany(lost));
        }
        match lost[..] {
            [] => {}
            [Block::P] => self.regen_p(kernel),
            [Block::Q] => self.regen_q(kernel),
            [Block::P, Block::Q] => {
                self.regen_p(kernel);
                self.regen_q(kernel);
            }
            [Block::Data(x)] | [Block::Data(x), Block::Q] => {
                self.data_from_p(kernel, x);
                if lost.len() == 2 {
                    self.regen_q(kernel);
                }
            }
            [Block::Data(x), Block::P] => {
                self.data_from_q(kernel, x);
                self.regen_p(kernel);
            }
            [Block::Data(x), Block::Data(y)] => self.two_data(kernel, x, y),
            _ => unreachable!("sorted, deduplicated, at most two"),
        }
        Ok(())
    }

    fn regen_p(&mut self, kernel: Kernel) {
        let data: Vec<&[u8]> = self.data.iter().map(|d| &**d).collect();
        gen_p(kernel, &data, self.p);
    }

    fn regen_q(&mut self, kernel: Kernel) {
        let q = self.q.as_deref_mut().expect("a RAID 6 stripe");
        let data: Vec<&[u8]> = self.data.iter().map(|d| &**d).collect();
        let mut p = vec![0u8; q.len()];
        gen_pq(kernel, &data, &mut p, q);
    }

    /// D_x = P ^ Σ_{i≠x} Dᵢ.
    fn data_from_p(&mut self, kernel: Kernel, x: usize) {
        let (before, rest) = self.data.split_at_mut(x);
        let (target, after) = rest.split_first_mut().expect("x < n");
        target.copy_from_slice(self.p);
        for d in before.iter().chain(after.iter()) {
            xor_into(kernel, target, d);
        }
    }

    /// D_x = (Q ^ Σ_{i≠x} gⁱ·Dᵢ) · g⁻ˣ.
    fn data_from_q(&mut self, kernel: Kernel, x: usize) {
        let len = self.p.len();
        let mut qx = vec![0u8; len];
        let mut px = vec![0u8; len];
        let zero = vec![0u8; len];
        {
            let data: Vec<&[u8]> = self
                .data
                .iter()
                .enumerate()
                .map(|(i, d)| if i == x { &zero[..] } else { &**d })
                .collect();
            gen_pq(kernel, &data, &mut px, &mut qx);
        }
        let q = self.q.as_deref().expect("a RAID 6 stripe");
        xor_into(kernel, &mut qx, q);
        mul_const(kernel, self.data[x], &qx, gf::inv(gf::pow2(x)), false);
    }

    /// Two data blocks x < y: with Pxy = P ^ Σ_{i≠x,y} Dᵢ and Qxy = Q ^
    /// Σ_{i≠x,y} gⁱDᵢ, D_x = A·Pxy ^ B·Qxy where A = g^(y-x) / (g^(y-x) ^ 1)
    /// and B = g⁻ˣ / (g^(y-x) ^ 1); then D_y = Pxy ^ D_x.
    fn two_data(&mut self, kernel: Kernel, x: usize, y: usize) {
        let len = self.p.len();
        let mut pxy = vec![0u8; len];
        let mut qxy = vec![0u8; len];
        let zero = vec![0u8; len];
        {
            let data: Vec<&[u8]> = self
                .data
                .iter()
                .enumerate()
                .map(|(i, d)| if i == x || i == y { &zero[..] } else { &**d })
                .collect();
            gen_pq(kernel, &data, &mut pxy, &mut qxy);
        }
        xor_into(kernel, &mut pxy, self.p);
        xor_into(
            kernel,
            &mut qxy,
            self.q.as_deref().expect("a RAID 6 stripe"),
        );
        let gyx = gf::pow2(y - x);
        let denominator = gf::inv(gyx ^ 1);
        let a = gf::mul(gyx, denominator);
        let b = gf::mul(gf::inv(gf::pow2(x)), denominator);
        let (low, high) = self.data.split_at_mut(y);
        let dx = &mut *low[x];
        mul_const(kernel, dx, &pxy, a, false);
        mul_const(kernel, dx, &qxy, b, true);
        let dy = &mut *high[0];
        dy.copy_from_slice(&pxy);
        xor_into(kernel, dy, dx);
    }
}
