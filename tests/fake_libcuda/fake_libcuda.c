/*
 * A recording stand-in for libcuda.so.1, for tests on machines without a GPU.
 *
 * Triton's nvidia backend compiles its launcher (backends/nvidia/driver.c, the
 * `cuda_utils` module) with gcc and links it against libcuda.so.1; at launch it
 * calls cuLaunchKernelEx. Loaded in place of the real driver, this library lets
 * that unmodified launcher run on a CPU: every driver call it makes succeeds with
 * plausible values (an sm_90 device), and each cuLaunchKernelEx is recorded
 * (grid, block, shared memory, stream, function, launch attributes and the bytes
 * of every kernel parameter) instead of launched. tests/fake_cuda_driver.py builds
 * it and reads the records back through the fake_* functions at the end.
 *
 * Built with Triton's own cuda.h (-I<triton>/backends/nvidia/include), so the
 * types and the symbol names (cuda.h maps some names to *_v2) are exactly those
 * the launcher was compiled against.
 */
#include "cuda.h"

#include <stdint.h>
#include <string.h>

#define MAX_FUNCTIONS 256   /* functions loaded in one process */
#define MAX_PARAMS 64       /* kernel parameters of one launch */
#define MAX_PARAM_BYTES 2048 /* their bytes, concatenated */
#define MAX_ATTRS 8         /* launch attributes (the launcher sets at most 4) */
#define MAX_LAUNCHES 256    /* records kept between two fake_reset calls */
#define NAME_LEN 128

/* One loaded kernel: its CUfunction is a pointer to this entry. The test tells
 * the size of each of its parameters (fake_set_param_sizes), which the driver
 * API never passes: cuLaunchKernelEx gets only `void **kernelParams`. */
typedef struct {
  char name[NAME_LEN];
  unsigned int num_params;
  unsigned int param_sizes[MAX_PARAMS];
} FakeFunction;

/* One recorded cuLaunchKernelEx, read by the test as a ctypes.Structure. */
typedef struct {
  unsigned int grid[3];
  unsigned int block[3];
  unsigned int shared_mem;
  unsigned int num_attrs;
  unsigned long long stream;
  unsigned long long function;
  unsigned long long extra; /* the `extra` argument (Triton passes NULL) */
  unsigned int attr_ids[MAX_ATTRS];
  unsigned char attr_values[MAX_ATTRS][64]; /* CUlaunchAttributeValue: 64 bytes */
  char name[NAME_LEN];      /* the function's name, as cuModuleGetFunction got it */
  int num_params;           /* -1: sizes unknown for this function, no bytes read */
  unsigned int param_bytes; /* bytes used in params[] */
  unsigned char params[MAX_PARAM_BYTES];
} FakeLaunch;

static FakeFunction functions[MAX_FUNCTIONS];
static unsigned int num_functions;
static int modules[MAX_FUNCTIONS]; /* CUmodule handles point into this array */
static unsigned int num_modules;
static FakeLaunch launches[MAX_LAUNCHES];
static unsigned int num_launches;
static int primary_context; /* the CUcontext handle points here */
static CUcontext current_context;

/* ---------------------------------------------------------------- test API */

/* Forget the records (the loaded functions stay). */
void fake_reset(void) { num_launches = 0; }

unsigned int fake_launch_count(void) { return num_launches; }

/* Copy record i to *out; 0 on success, -1 when there is no such record. */
int fake_get_launch(unsigned int i, FakeLaunch *out) {
  if (i >= num_launches)
    return -1;
  *out = launches[i];
  return 0;
}

/* Sizes of the n parameters of `function` (a CUfunction this library made),
 * from the launcher's signature: what cuLaunchKernelEx copies from each
 * kernelParams[i]. 0 on success, -1 for an unknown function or too many. */
int fake_set_param_sizes(unsigned long long function, unsigned int n,
                         const unsigned int *sizes) {
  FakeFunction *f = (FakeFunction *)(uintptr_t)function;
  if (f < functions || f >= functions + num_functions || n > MAX_PARAMS)
    return -1;
  f->num_params = n;
  memcpy(f->param_sizes, sizes, n * sizeof(unsigned int));
  return 0;
}

/* ------------------------------------------------- errors and initialisation */

/* gpuAssert formats every failing call's message with it. */
CUresult cuGetErrorString(CUresult error, const char **pStr) {
  *pStr = error == CUDA_SUCCESS ? "no error" : "fake libcuda error";
  return CUDA_SUCCESS;
}

/* driver.py's _cuda_driver_is_active (torch-free processes) calls these two. */
CUresult cuInit(unsigned int flags) { return CUDA_SUCCESS; }

CUresult cuDeviceGetCount(int *count) {
  *count = 1;
  return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *version) { /* the TMA descriptor fill */
  *version = 12080;
  return CUDA_SUCCESS;
}

/* ------------------------------------------- device and context (one of each) */

/* ensureCudaContext, load_binary, get_current_device and set_current_device
 * retain the primary context of device 0 and make it current. */
CUresult cuDeviceGet(CUdevice *device, int ordinal) {
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
  *pctx = (CUcontext)&primary_context;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *pctx) {
  *pctx = current_context;
  return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
  current_context = ctx;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice *device) {
  *device = 0;
  return CUDA_SUCCESS;
}

/* set_printf_fifo_size */
CUresult cuCtxGetLimit(size_t *value, CUlimit limit) {
  *value = 0;
  return CUDA_SUCCESS;
}

CUresult cuCtxSetLimit(CUlimit limit, size_t value) { return CUDA_SUCCESS; }

/* get_device_properties / get_device_capability / load_binary: an sm_90 device
 * with an H100's limits (the compile target the tests use). */
CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib,
                              CUdevice dev) {
  switch (attrib) {
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
    *pi = 9;
    break;
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
    *pi = 0;
    break;
  case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN:
    *pi = 232448;
    break;
  case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR:
    *pi = 233472;
    break;
  case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK:
    *pi = 65536;
    break;
  case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
    *pi = 132;
    break;
  case CU_DEVICE_ATTRIBUTE_WARP_SIZE:
    *pi = 32;
    break;
  case CU_DEVICE_ATTRIBUTE_CLOCK_RATE:
    *pi = 1980000;
    break;
  case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE:
    *pi = 2619000;
    break;
  case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH:
    *pi = 5120;
    break;
  default:
    *pi = 0;
  }
  return CUDA_SUCCESS;
}

/* is_stream_capturing: never capturing. */
CUresult cuStreamIsCapturing(CUstream stream, CUstreamCaptureStatus *status) {
  *status = CU_STREAM_CAPTURE_STATUS_NONE;
  return CUDA_SUCCESS;
}

/* ------------------------------------------------------ modules and functions */

/* load_binary: the cubin is not read; each load gets a module handle. */
CUresult cuModuleLoadData(CUmodule *module, const void *image) {
  if (num_modules == MAX_FUNCTIONS)
    return CUDA_ERROR_OUT_OF_MEMORY;
  *module = (CUmodule)&modules[num_modules++];
  return CUDA_SUCCESS;
}

CUresult cuModuleUnload(CUmodule hmod) { return CUDA_SUCCESS; }

/* Each lookup makes a distinct function handle (so a launch of another
 * compiled kernel shows as another function), named for the records. */
CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod,
                             const char *name) {
  if (num_functions == MAX_FUNCTIONS)
    return CUDA_ERROR_OUT_OF_MEMORY;
  FakeFunction *f = &functions[num_functions++];
  strncpy(f->name, name, NAME_LEN - 1);
  f->num_params = 0;
  *hfunc = (CUfunction)f;
  return CUDA_SUCCESS;
}

/* load_binary reads registers, spills and the thread limit; Triton checks
 * num_warps * 32 against CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK. */
CUresult cuFuncGetAttribute(int *pi, CUfunction_attribute attrib,
                            CUfunction hfunc) {
  *pi = attrib == CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK ? 1024
        : attrib == CU_FUNC_ATTRIBUTE_NUM_REGS            ? 32
                                                          : 0;
  return CUDA_SUCCESS;
}

/* load_binary (over 48 KB of shared memory), occupancy, 16-CTA clusters. */
CUresult cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib,
                            int value) {
  return CUDA_SUCCESS;
}

CUresult cuFuncSetCacheConfig(CUfunction hfunc, CUfunc_cache config) {
  return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------- memory */

/* extractPointer asks for the device address of every tensor argument: host
 * memory stands for device memory here, so the address is its own. */
CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute,
                               CUdeviceptr ptr) {
  if (attribute != CU_POINTER_ATTRIBUTE_DEVICE_POINTER)
    return CUDA_ERROR_INVALID_VALUE;
  *(CUdeviceptr *)data = ptr;
  return CUDA_SUCCESS;
}

/* ------------------------------------- looked up with dlsym by the launcher */

/* cuOccupancyMaxActiveClusters (num_ctas > 1 only). */
CUresult cuOccupancyMaxActiveClusters(int *numClusters, CUfunction func,
                                      const CUlaunchConfig *config) {
  *numClusters = 1;
  return CUDA_SUCCESS;
}

/* fill_tma_descriptor_*: the package's kernels use no TMA descriptors; a zero
 * descriptor keeps these resolvable. */
CUresult cuTensorMapEncodeTiled(
    CUtensorMap *tensorMap, CUtensorMapDataType tensorDataType,
    cuuint32_t tensorRank, void *globalAddress, const cuuint64_t *globalDim,
    const cuuint64_t *globalStrides, const cuuint32_t *boxDim,
    const cuuint32_t *elementStrides, CUtensorMapInterleave interleave,
    CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2Promotion,
    CUtensorMapFloatOOBfill oobFill) {
  memset(tensorMap, 0, sizeof(*tensorMap));
  return CUDA_SUCCESS;
}

CUresult cuTensorMapEncodeIm2col(
    CUtensorMap *tensorMap, CUtensorMapDataType tensorDataType,
    cuuint32_t tensorRank, void *globalAddress, const cuuint64_t *globalDim,
    const cuuint64_t *globalStrides, const int *pixelBoxLowerCorner,
    const int *pixelBoxUpperCorner, cuuint32_t channelsPerPixel,
    cuuint32_t pixelsPerColumn, const cuuint32_t *elementStrides,
    CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
    CUtensorMapL2promotion l2Promotion, CUtensorMapFloatOOBfill oobFill) {
  memset(tensorMap, 0, sizeof(*tensorMap));
  return CUDA_SUCCESS;
}

/* The launch itself: record everything the driver would receive. The bytes of
 * kernelParams[i] are copied with the size the test registered for the
 * function; without sizes none are read (num_params = -1). */
CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f,
                          void **kernelParams, void **extra) {
  if (num_launches == MAX_LAUNCHES)
    return CUDA_ERROR_OUT_OF_MEMORY;
  FakeLaunch *r = &launches[num_launches++];
  memset(r, 0, sizeof(*r));
  r->grid[0] = config->gridDimX;
  r->grid[1] = config->gridDimY;
  r->grid[2] = config->gridDimZ;
  r->block[0] = config->blockDimX;
  r->block[1] = config->blockDimY;
  r->block[2] = config->blockDimZ;
  r->shared_mem = config->sharedMemBytes;
  r->stream = (unsigned long long)(uintptr_t)config->hStream;
  r->function = (unsigned long long)(uintptr_t)f;
  r->extra = (unsigned long long)(uintptr_t)extra;
  r->num_attrs = config->numAttrs;
  for (unsigned int i = 0; i < config->numAttrs && i < MAX_ATTRS; i++) {
    r->attr_ids[i] = config->attrs[i].id;
    memcpy(r->attr_values[i], &config->attrs[i].value, 64);
  }
  FakeFunction *fn = (FakeFunction *)f;
  if (fn < functions || fn >= functions + num_functions) {
    r->num_params = -1; /* not a function of this library */
    return CUDA_SUCCESS;
  }
  strncpy(r->name, fn->name, NAME_LEN - 1);
  if (fn->num_params == 0) {
    r->num_params = -1;
    return CUDA_SUCCESS;
  }
  unsigned int off = 0;
  for (unsigned int i = 0; i < fn->num_params; i++) {
    unsigned int size = fn->param_sizes[i];
    if (off + size > MAX_PARAM_BYTES)
      return CUDA_ERROR_INVALID_VALUE;
    memcpy(r->params + off, kernelParams[i], size);
    off += size;
  }
  r->num_params = (int)fn->num_params;
  r->param_bytes = off;
  return CUDA_SUCCESS;
}
