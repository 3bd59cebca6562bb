//! Every kernel this CPU has agrees with the scalar reference, and every
//! recovery case gives back the lost blocks, for random stripes (widths 1
//! to 20 data blocks, lengths that are and are not multiples of the SIMD
//! step).

use nvraid_parity::{gen_pq, mul_const, scalar, xor_into, Block, Kernel, Stripe};
use proptest::prelude::*;

fn stripe_strategy() -> impl Strategy<Value = (Vec<Vec<u8>>, usize)> {
    (1usize..=20, 1usize..300).prop_flat_map(|(n, len)| {
        (
            prop::collection::vec(prop::collection::vec(any::<u8>(), len), n),
            Just(len),
        )
    })
}

proptest! {
    #[test]
    fn simd_generation_agrees_with_scalar((data, len) in stripe_strategy(), c in any::<u8>()) {
        let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let (mut p0, mut q0) = (vec![0u8; len], vec![0u8; len]);
        scalar::gen_pq(&refs, &mut p0, &mut q0);
        let mut m0 = vec![7u8; len];
        scalar::mul_const(&mut m0, &data[0], c, true);
        for kernel in Kernel::available() {
            let (mut p, mut q) = (vec![0u8; len], vec![0u8; len]);
            gen_pq(kernel, &refs, &mut p, &mut q);
            prop_assert_eq!(&p, &p0, "P, {}", kernel.name());
            prop_assert_eq!(&q, &q0, "Q, {}", kernel.name());
            let mut p5 = vec![0u8; len];
            nvraid_parity::gen_p(kernel, &refs, &mut p5);
            prop_assert_eq!(&p5, &p0, "RAID 5 P, {}", kernel.name());
            let mut m = vec![7u8; len];
            mul_const(kernel, &mut m, &data[0], c, true);
            prop_assert_eq!(&m, &m0, "c * D xor, {}", kernel.name());
            let mut x = data[0].clone();
            xor_into(kernel, &mut x, &p0);
            let mut x0 = data[0].clone();
            scalar::xor_into(&mut x0, &p0);
            prop_assert_eq!(&x, &x0, "xor, {}", kernel.name());
        }
    }

    #[test]
    fn every_one_or_two_lost_blocks_come_back(
        (data, len) in stripe_strategy(),
        a in any::<prop::sample::Index>(),
        b in any::<prop::sample::Index>(),
    ) {
        let n = data.len();
        let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let (mut p, mut q) = (vec![0u8; len], vec![0u8; len]);
        scalar::gen_pq(&refs, &mut p, &mut q);
        // Blocks 0..n are data, n is P, n + 1 is Q.
        let block = |i: usize| match i {
            i if i < n => Block::Data(i),
            i if i == n => Block::P,
            _ => Block::Q,
        };
        let lost = [block(a.index(n + 2)), block(b.index(n + 2))];
        for kernel in Kernel::available() {
            let mut d = data.clone();
            let (mut pp, mut qq) = (p.clone(), q.clone());
            for l in lost {
                match l {
                    Block::Data(i) => d[i].fill(0xee),
                    Block::P => pp.fill(0xee),
                    Block::Q => qq.fill(0xee),
                }
            }
            let mut stripe = Stripe {
                data: d.iter_mut().map(Vec::as_mut_slice).collect(),
                p: &mut pp,
                q: Some(&mut qq),
            };
            stripe.recover(kernel, &lost).unwrap();
            prop_assert_eq!(&d, &data, "data after losing {:?}, {}", lost, kernel.name());
            prop_assert_eq!(&pp, &p, "P after losing {:?}", lost);
            prop_assert_eq!(&qq, &q, "Q after losing {:?}", lost);
        }
    }
}

#[test]
fn raid5_recovers_one_block_and_refuses_two() {
    let data = [vec![1u8, 2, 3], vec![4, 5, 6], vec![7, 8, 9]];
    let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    let mut p = vec![0u8; 3];
    nvraid_parity::gen_p(Kernel::best(), &refs, &mut p);
    assert_eq!(p, vec![1 ^ 4 ^ 7, 2 ^ 5 ^ 8, 3 ^ 6 ^ 9]);
    let mut d = data.clone();
    d[1].fill(0);
    let mut stripe = Stripe {
        data: d.iter_mut().map(Vec::as_mut_slice).collect(),
        p: &mut p,
        q: None,
    };
    stripe.recover(Kernel::best(), &[Block::Data(1)]).unwrap();
    assert_eq!(stripe.data[1], &data[1][..]);
    assert!(stripe
        .recover(Kernel::best(), &[Block::Data(0), Block::Data(2)])
        .is_err());
    assert!(stripe.recover(Kernel::best(), &[Block::Q]).is_err());
}

/// md's Q for a stripe worked by hand: D0 = 1, D1 = 1, D2 = 0x80 (one byte
/// each). Q = g⁰·1 ^ g¹·1 ^ g²·0x80, and 0x80·2 = 0x1d (reduced by 0x11d),
/// ·2 again = 0x3a; so Q = 1 ^ 2 ^ 0x3a = 0x39 and P = 0x80.
#[test]
fn q_matches_hand_computed_values() {
    let data: [&[u8]; 3] = [&[1], &[1], &[0x80]];
    let (mut p, mut q) = ([0u8], [0u8]);
    gen_pq(Kernel::Scalar, &data, &mut p, &mut q);
    assert_eq!(p[0], 0x80);
    assert_eq!(q[0], 0x39);
}
