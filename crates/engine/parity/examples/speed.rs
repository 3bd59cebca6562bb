//! Parity generation per core next to memcpy of the same buffers (issue 11's
//! target: RAID 5 >= 0.8x memcpy, RAID 6 >= 0.5x). One thread; each figure
//! is data bytes processed per second, the best of 5 runs of ~0.3 s.
//!
//!     cargo run --release -p nvraid-parity --example speed [DATA_BLOCKS] [BLOCK_KIB]
//!
//! Default: 4 data blocks of 64 KiB (a 4+1 / 4+2 stripe with 64 KiB chunks).

use nvraid_parity::{gen_p, gen_pq, Kernel};
use std::hint::black_box;
use std::time::{Duration, Instant};

fn rate(bytes: usize, mut f: impl FnMut()) -> f64 {
    let mut best = 0f64;
    for _ in 0..5 {
        let started = Instant::now();
        let mut rounds = 0u64;
        while started.elapsed() < Duration::from_millis(300) {
            f();
            rounds += 1;
        }
        best = best.max(rounds as f64 * bytes as f64 / started.elapsed().as_secs_f64());
    }
    best
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let n = args.first().copied().unwrap_or(4);
    let len = args.get(1).copied().unwrap_or(64) << 10;
    let data: Vec<Vec<u8>> = (0..n)
        .map(|i| (0..len).map(|j| (j * 31 + i * 7) as u8).collect())
        .collect();
    let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    let total = n * len;
    let mut copy = vec![0u8; total];
    let memcpy = rate(total, || {
        for (i, d) in refs.iter().enumerate() {
            copy[i * len..(i + 1) * len].copy_from_slice(d);
        }
        black_box(&copy);
    });
    println!(
        "{n} data blocks of {} KiB; memcpy of the same bytes: {:.2} GB/s",
        len >> 10,
        memcpy / 1e9
    );
    let (mut p, mut q) = (vec![0u8; len], vec![0u8; len]);
    for kernel in Kernel::available() {
        let r5 = rate(total, || {
            gen_p(kernel, &refs, &mut p);
            black_box(&p);
        });
        let r6 = rate(total, || {
            gen_pq(kernel, &refs, &mut p, &mut q);
            black_box((&p, &q));
        });
        println!(
            "{:<9} RAID 5 P: {:6.2} GB/s ({:.2}x memcpy)   RAID 6 P+Q: {:6.2} GB/s ({:.2}x memcpy)",
            kernel.name(),
            r5 / 1e9,
            r5 / memcpy,
            r6 / 1e9,
            r6 / memcpy
        );
    }
}
