// Declares an op family's backend entry points in one line: each op of gt::ops gets an entry point of its own
// signature in gt::cpu and, in a build with CUDA, in gt::cuda, which GT_DISPATCH (ops/dispatch.h) calls.
#pragma once

/// GT_BACKEND_ENTRY_POINTS(softmax_forward, softmax_backward) declares, after the ops in gt::ops,
///   namespace gt::cpu { decltype(ops::softmax_forward) softmax_forward; ... }
/// and the same in gt::cuda when GT_WITH_CUDA is set: the op's own signature, so an entry point cannot drift from
/// its contract. Up to eight ops; written at global scope, without a semicolon after it.
#define GT_BACKEND_ENTRY_POINTS(...)    \
  GT_ENTRY_POINTS_IN_(cpu, __VA_ARGS__) \
  GT_CUDA_ENTRY_POINTS_(__VA_ARGS__)

#if GT_WITH_CUDA
#define GT_CUDA_ENTRY_POINTS_(...) GT_ENTRY_POINTS_IN_(cuda, __VA_ARGS__)
#else
#define GT_CUDA_ENTRY_POINTS_(...)
#endif

#define GT_ENTRY_POINTS_IN_(backend, ...)    \
  namespace gt::backend {                    \
  GT_FOR_EACH_(GT_ENTRY_POINT_, __VA_ARGS__) \
  }
#define GT_ENTRY_POINT_(op) decltype(::gt::ops::op) op;

// GT_FOR_EACH_(m, a, b, c) is m(a) m(b) m(c), for one to eight arguments.
#define GT_FOR_EACH_(m, ...)                                                                                        \
  GT_PICK_9TH_(__VA_ARGS__, GT_EACH8_, GT_EACH7_, GT_EACH6_, GT_EACH5_, GT_EACH4_, GT_EACH3_, GT_EACH2_, GT_EACH1_, \
               unused)                                                                                              \
  (m, __VA_ARGS__)
#define GT_PICK_9TH_(a1, a2, a3, a4, a5, a6, a7, a8, n, ...) n
#define GT_EACH1_(m, a) m(a)
#define GT_EACH2_(m, a, ...) m(a) GT_EACH1_(m, __VA_ARGS__)
#define GT_EACH3_(m, a, ...) m(a) GT_EACH2_(m, __VA_ARGS__)
#define GT_EACH4_(m, a, ...) m(a) GT_EACH3_(m, __VA_ARGS__)
#define GT_EACH5_(m, a, ...) m(a) GT_EACH4_(m, __VA_ARGS__)
#define GT_EACH6_(m, a, ...) m(a) GT_EACH5_(m, __VA_ARGS__)
#define GT_EACH7_(m, a, ...) m(a) GT_EACH6_(m, __VA_ARGS__)
#define GT_EACH8_(m, a, ...) m(a) GT_EACH7_(m, __VA_ARGS__)
