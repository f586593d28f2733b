// LS_HOST_DEVICE marks a function that the CPU twin of an op and its CUDA
// kernel share (compiled for both when nvcc reads it, for the host otherwise).
#pragma once

#ifdef __CUDACC__
#define LS_HOST_DEVICE __host__ __device__
#else
#define LS_HOST_DEVICE
#endif
