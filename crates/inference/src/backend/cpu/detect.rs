//! Runtime CPU feature detection: which instruction sets this process may use.
//!
//! `std::is_x86_feature_detected!` checks both CPUID and the OS support for the wider register
//! state (XGETBV), and caches its answer, so asking again is cheap. This module only answers
//! questions; `dispatch` turns the answer into a kernel table.

use std::fmt;

/// An instruction set with its own kernel table, best first in [`Isa::ALL`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// AVX-512F (with AVX2 and FMA): 16 f32 lanes, 32 vector registers.
    Avx512,
    /// AVX2 with FMA: 8 f32 lanes, 16 vector registers.
    Avx2,
    /// Portable Rust, no intrinsics: the reference kernels, plus a blocked GEMM the compiler
    /// vectorizes for the baseline target.
    Scalar,
}

impl Isa {
    /// Every instruction set, best first.
    pub const ALL: [Isa; 3] = [Isa::Avx512, Isa::Avx2, Isa::Scalar];

    /// Short lowercase name (`"avx512"`, `"avx2"`, `"scalar"`), as reported by `isa()`.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx512 => "avx512",
            Isa::Avx2 => "avx2",
            Isa::Scalar => "scalar",
        }
    }

    /// Whether this CPU and OS can run this instruction set's kernels.
    pub fn is_supported(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                std::is_x86_feature_detected!("avx512f")
                    && std::is_x86_feature_detected!("avx2")
                    && std::is_x86_feature_detected!("fma")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
            }
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx512 | Isa::Avx2 => false,
        }
    }

    /// The best supported instruction set.
    pub fn best() -> Isa {
        Isa::ALL
            .into_iter()
            .find(|isa| isa.is_supported())
            .unwrap_or(Isa::Scalar)
    }
}

/// Whether the CPU has the AVX-512 extensions of the quantized kernels: BW (byte/word ops),
/// VL and VNNI (`vpdpbusd`), on top of what [`Isa::Avx512`] needs.
pub fn avx512_vnni_supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512vl")
            && std::is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the CPU has F16C (f16 ↔ f32 conversion), used by the AVX2 quantized kernels.
pub fn f16c_supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalar_is_always_supported_and_best_is_supported() {
        assert!(Isa::Scalar.is_supported());
        assert!(Isa::best().is_supported());
        assert_eq!(Isa::best().to_string(), Isa::best().name());
    }
}
