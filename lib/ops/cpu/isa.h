// The instruction sets the CPU kernels' hot loops are compiled for, and which of them runs (GT_CPU_KERNEL in
// ops/cpu/vec_math.h). Each such loop is compiled three times — for x86-64-v4 (AVX-512), x86-64-v3 (AVX2 with FMA)
// and the build's baseline — and a call runs the widest the CPU has, or the one a test forced: so every machine can
// test every path below its own, where GCC's target_clones picked one when the program loaded and left the others
// untested on any CPU that has a wider one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace gt::cpu {

enum class CpuIsa { baseline, avx2, avx512 };
std::string to_string(CpuIsa isa);

/// The widest of the three this CPU runs: avx512 with AVX-512 F, BW, CD, DQ and VL (x86-64-v4), avx2 with AVX2, FMA,
/// BMI1 and BMI2 (x86-64-v3's, as far as the compilers can ask), otherwise (and on other architectures) baseline.
CpuIsa best_cpu_isa();

/// The path GPUTRAIN_CPU_ISA asks for (auto or unset: best_cpu_isa(); avx512, avx2 or baseline: that one, refused
/// with an Error naming the variable when the CPU lacks it or the value is none of these). Read once; the CLI reads
/// it on its main thread before any kernel runs (a kernel may first ask from an OpenMP thread, which cannot throw).
/// What it is for: running a narrower CPU's arithmetic on a wider one (the AVX2 path gives the AVX-512 path's bits,
/// tests/test_cpu_isa.cpp), and measuring what the wider path gains.
CpuIsa env_cpu_isa();

/// What the kernels run now: env_cpu_isa(), or the path a test forced.
CpuIsa cpu_isa();

/// Tests: run every GT_CPU_KERNEL loop compiled for `isa` from now on (nullopt: env_cpu_isa()'s again). Refused
/// (returns false, changes nothing) for an instruction set this CPU lacks. Process-wide: call it where no kernel
/// runs.
bool force_cpu_isa(std::optional<CpuIsa> isa);

/// Tests: how many GT_CPU_KERNEL calls the calling thread has run on `isa`'s path (which a test forcing a path checks
/// moved, and the others did not).
uint64_t cpu_kernel_calls(CpuIsa isa);

namespace detail {
extern thread_local uint64_t t_kernel_calls[3];  // by CpuIsa; GT_CPU_KERNEL counts its calls
}  // namespace detail

}  // namespace gt::cpu
