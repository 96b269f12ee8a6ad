/*
 * device_cuda.h — the work of the `cuda` device's two engines (device_cuda.cu), behind a C API.
 *
 * The `cuda` device is the engine machinery of device_sim.c (two host threads, queues, sequence
 * numbers, cancel, watchdog-aware waits, event log) whose operations run on a GPU instead of host
 * memory: the copy thread calls cudev_copy, the compute thread cudev_ffn. Each call issues its work
 * on its own stream (copy stream / compute stream) and returns once the stream has finished it, so
 * the thread's release store of copies_done / computes_done follows the effects on the device
 * (device.h's protocol); a computation is issued only after the copy it names has completed.
 *
 * Host memory: blob pieces are pieces of the mmapped GGUF or expert pack. They are NOT registered
 * with cudaHostRegister: pinning a mapping of a file larger than RAM (the case offload exists
 * for) would lock it all in memory, and read-only file mappings need cudaHostRegisterReadOnly,
 * which not every driver has. The copy thread memcpys the pieces into a pinned staging buffer
 * (one slot), and the DMA runs from there.
 */
#ifndef STRATA_DEVICE_DEVICE_CUDA_H
#define STRATA_DEVICE_DEVICE_CUDA_H

#include "device.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cudev cudev;

/* Device memory for n_slots x slot_bytes on GPU 0, two streams, pinned staging. Fails with
 * STRATA_ERR_NO_DEVICE (a message, never a crash) without a usable GPU. */
strata_status cudev_create(int32_t n_slots, size_t slot_bytes, cudev **out);
void cudev_free(cudev *c);
/* Copy the pieces (concatenated) into slot; returns when the bytes are on the device. */
strata_status cudev_copy(cudev *c, int32_t slot, const void *const src[3], const size_t bytes[3]);
/* One expert computation (device.h's mdev_group): returns when out is written. */
strata_status cudev_ffn(cudev *c, const mdev_group *g);
/* Timed pinned host -> device copies of `bytes`, best of reps, in GB/s (0 on failure). */
double cudev_probe(cudev *c, size_t bytes, int reps);
/* 1 when every matrix type of the shape has a CUDA decoder (kernels/cuda/blocks.cuh). */
int cudev_supports(const mdev_expert_shape *s);

#ifdef __cplusplus
}
#endif

#endif
