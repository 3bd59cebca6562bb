//! Arithmetic in GF(2⁸) with md's polynomial x⁸ + x⁴ + x³ + x² + 1 (0x11d)
//! and generator g = 2 (`{02}`), the field md's RAID 6 computes Q in.

/// The reduction polynomial without its x⁸ term.
pub const POLY: u8 = 0x1d;

/// `x · 2` in the field.
pub const fn mul2(x: u8) -> u8 {
    (x << 1) ^ if x & 0x80 != 0 { POLY } else { 0 }
}

/// Tables of powers and logarithms of g, built at compile time.
struct Tables {
    exp: [u8; 512],
    log: [u8; 256],
}

const TABLES: Tables = {
    let mut exp = [0u8; 512];
    let mut log = [0u8; 256];
    let mut x: u8 = 1;
    let mut i = 0;
    while i < 255 {
        exp[i] = x;
        exp[i + 255] = x;
        log[x as usize] = i as u8;
        x = mul2(x);
        i += 1;
    }
    // exp[510], exp[511] are never used (log a + log b <= 508).
    Tables { exp, log }
};

/// `a · b` in the field.
pub fn mul(a: u8, b: u8) -> u8 {
    if a == 0 || b == 0 {
        return 0;
    }
    TABLES.exp[TABLES.log[a as usize] as usize + TABLES.log[b as usize] as usize]
}

/// `gⁱ`.
pub fn pow2(i: usize) -> u8 {
    TABLES.exp[i % 255]
}

/// The multiplicative inverse of `a` (`a` ≠ 0).
pub fn inv(a: u8) -> u8 {
    assert_ne!(a, 0, "zero has no inverse in GF(2^8)");
    TABLES.exp[(255 - TABLES.log[a as usize] as usize) % 255]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Schoolbook multiplication, for checking the tables.
    fn slow_mul(mut a: u8, mut b: u8) -> u8 {
        let mut product = 0;
        while b != 0 {
            if b & 1 != 0 {
                product ^= a;
            }
            a = mul2(a);
            b >>= 1;
        }
        product
    }

    #[test]
    fn tables_agree_with_schoolbook_multiplication() {
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                assert_eq!(mul(a, b), slow_mul(a, b), "{a} * {b}");
            }
            if a != 0 {
                assert_eq!(mul(a, inv(a)), 1, "inverse of {a}");
            }
        }
        // g generates the whole multiplicative group.
        let mut seen = [false; 256];
        for i in 0..255 {
            seen[pow2(i) as usize] = true;
        }
        assert_eq!(seen.iter().filter(|s| **s).count(), 255);
        assert_eq!(pow2(8), 0x1d);
    }
}
