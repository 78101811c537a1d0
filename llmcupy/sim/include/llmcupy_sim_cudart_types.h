// The CUDA runtime's types and enumerators that NVRTC declares in every kernel without an #include
// (its built-in driver_types.h, texture_types.h, surface_types.h, device_types.h and library_types.h):
// a kernel may name cudaError_t, compare a value with cudaErrorInvalidValue, take a cudaStream_t or a
// cudaTextureObject_t argument, read a cudaExtent's width. NVRTC declares none of the runtime's functions
// (cudaGetLastError, cudaMalloc, ...: host code), nor make_cudaExtent; sim/compiler.py names those.
// The set is the one NVRTC 12.4, 12.9 and 13.5 have in common, with their values (tests/test_nvrtc_parity.py
// compiles a static_assert of each value here under the three): a name only some of them declare
// (cudaLaunchParams, which CUDA 13 removed; enumerators added since 12.4) would compile here and fail on
// a GPU with another CUDA. Left out, as a kernel has no use for them: the enumerators marked reserved and
// the enums of the host API's options (graph nodes, memory pools, external memory, interop, JIT, ...);
// sim/compiler.py says so for a cuda... name the emulator lacks.
#pragma once
#include <cstddef>

enum cudaError {
cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2, cudaErrorInitializationError = 3,
    cudaErrorCudartUnloading = 4, cudaErrorProfilerDisabled = 5, cudaErrorProfilerNotInitialized = 6,
    cudaErrorProfilerAlreadyStarted = 7, cudaErrorProfilerAlreadyStopped = 8, cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidPitchValue = 12, cudaErrorInvalidSymbol = 13, cudaErrorInvalidHostPointer = 16,
    cudaErrorInvalidDevicePointer = 17, cudaErrorInvalidTexture = 18, cudaErrorInvalidTextureBinding = 19,
    cudaErrorInvalidChannelDescriptor = 20, cudaErrorInvalidMemcpyDirection = 21, cudaErrorAddressOfConstant = 22,
    cudaErrorTextureFetchFailed = 23, cudaErrorTextureNotBound = 24, cudaErrorSynchronizationError = 25,
    cudaErrorInvalidFilterSetting = 26, cudaErrorInvalidNormSetting = 27, cudaErrorMixedDeviceExecution = 28,
    cudaErrorNotYetImplemented = 31, cudaErrorMemoryValueTooLarge = 32, cudaErrorStubLibrary = 34,
    cudaErrorInsufficientDriver = 35, cudaErrorCallRequiresNewerDriver = 36, cudaErrorInvalidSurface = 37,
    cudaErrorDuplicateVariableName = 43, cudaErrorDuplicateTextureName = 44, cudaErrorDuplicateSurfaceName = 45,
    cudaErrorDevicesUnavailable = 46, cudaErrorIncompatibleDriverContext = 49, cudaErrorMissingConfiguration = 52,
    cudaErrorPriorLaunchFailure = 53, cudaErrorLaunchMaxDepthExceeded = 65, cudaErrorLaunchFileScopedTex = 66,
    cudaErrorLaunchFileScopedSurf = 67, cudaErrorSyncDepthExceeded = 68, cudaErrorLaunchPendingCountExceeded = 69,
    cudaErrorInvalidDeviceFunction = 98, cudaErrorNoDevice = 100, cudaErrorInvalidDevice = 101,
    cudaErrorDeviceNotLicensed = 102, cudaErrorSoftwareValidityNotEstablished = 103, cudaErrorStartupFailure = 127,
    cudaErrorInvalidKernelImage = 200, cudaErrorDeviceUninitialized = 201, cudaErrorMapBufferObjectFailed = 205,
    cudaErrorUnmapBufferObjectFailed = 206, cudaErrorArrayIsMapped = 207, cudaErrorAlreadyMapped = 208,
    cudaErrorNoKernelImageForDevice = 209, cudaErrorAlreadyAcquired = 210, cudaErrorNotMapped = 211,
    cudaErrorNotMappedAsArray = 212, cudaErrorNotMappedAsPointer = 213, cudaErrorECCUncorrectable = 214,
    cudaErrorUnsupportedLimit = 215, cudaErrorDeviceAlreadyInUse = 216, cudaErrorPeerAccessUnsupported = 217,
    cudaErrorInvalidPtx = 218, cudaErrorInvalidGraphicsContext = 219, cudaErrorNvlinkUncorrectable = 220,
    cudaErrorJitCompilerNotFound = 221, cudaErrorUnsupportedPtxVersion = 222, cudaErrorJitCompilationDisabled = 223,
    cudaErrorUnsupportedExecAffinity = 224, cudaErrorUnsupportedDevSideSync = 225, cudaErrorInvalidSource = 300,
    cudaErrorFileNotFound = 301, cudaErrorSharedObjectSymbolNotFound = 302, cudaErrorSharedObjectInitFailed = 303,
    cudaErrorOperatingSystem = 304, cudaErrorInvalidResourceHandle = 400, cudaErrorIllegalState = 401,
    cudaErrorLossyQuery = 402, cudaErrorSymbolNotFound = 500, cudaErrorNotReady = 600, cudaErrorIllegalAddress = 700,
    cudaErrorLaunchOutOfResources = 701, cudaErrorLaunchTimeout = 702, cudaErrorLaunchIncompatibleTexturing = 703,
    cudaErrorPeerAccessAlreadyEnabled = 704, cudaErrorPeerAccessNotEnabled = 705, cudaErrorSetOnActiveProcess = 708,
    cudaErrorContextIsDestroyed = 709, cudaErrorAssert = 710, cudaErrorTooManyPeers = 711,
    cudaErrorHostMemoryAlreadyRegistered = 712, cudaErrorHostMemoryNotRegistered = 713,
    cudaErrorHardwareStackError = 714, cudaErrorIllegalInstruction = 715, cudaErrorMisalignedAddress = 716,
    cudaErrorInvalidAddressSpace = 717, cudaErrorInvalidPc = 718, cudaErrorLaunchFailure = 719,
    cudaErrorCooperativeLaunchTooLarge = 720, cudaErrorNotPermitted = 800, cudaErrorNotSupported = 801,
    cudaErrorSystemNotReady = 802, cudaErrorSystemDriverMismatch = 803, cudaErrorCompatNotSupportedOnDevice = 804,
    cudaErrorMpsConnectionFailed = 805, cudaErrorMpsRpcFailure = 806, cudaErrorMpsServerNotReady = 807,
    cudaErrorMpsMaxClientsReached = 808, cudaErrorMpsMaxConnectionsReached = 809, cudaErrorMpsClientTerminated = 810,
    cudaErrorCdpNotSupported = 811, cudaErrorCdpVersionMismatch = 812, cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorStreamCaptureInvalidated = 901, cudaErrorStreamCaptureMerge = 902, cudaErrorStreamCaptureUnmatched = 903,
    cudaErrorStreamCaptureUnjoined = 904, cudaErrorStreamCaptureIsolation = 905, cudaErrorStreamCaptureImplicit = 906,
    cudaErrorCapturedEvent = 907, cudaErrorStreamCaptureWrongThread = 908, cudaErrorTimeout = 909,
    cudaErrorGraphExecUpdateFailure = 910, cudaErrorExternalDevice = 911, cudaErrorInvalidClusterSize = 912,
    cudaErrorUnknown = 999, cudaErrorApiFailureBase = 10000
};
typedef enum cudaError cudaError_t;

// handles the host API gives out; in device code a kernel can only pass one on or compare it with 0
typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;
typedef struct CUgraph_st* cudaGraph_t;
typedef struct CUgraphNode_st* cudaGraphNode_t;
typedef struct CUgraphExec_st* cudaGraphExec_t;
typedef struct CUuserObject_st* cudaUserObject_t;
typedef struct CUfunc_st* cudaFunction_t;
typedef struct CUkern_st* cudaKernel_t;
typedef struct CUmemPoolHandle_st* cudaMemPool_t;
typedef struct cudaArray* cudaArray_t;
typedef const struct cudaArray* cudaArray_const_t;
typedef struct cudaMipmappedArray* cudaMipmappedArray_t;
typedef const struct cudaMipmappedArray* cudaMipmappedArray_const_t;
typedef struct cudaGraphicsResource* cudaGraphicsResource_t;
typedef struct CUexternalMemory_st* cudaExternalMemory_t;
typedef struct CUexternalSemaphore_st* cudaExternalSemaphore_t;
// Texture and surface objects are 64-bit handles: a kernel may take and pass one, and the same source runs
// here; reading through one (tex1Dfetch, surf2Dread, ...) is not emulated, and sim/compiler.py says so there.
typedef unsigned long long cudaTextureObject_t;
typedef unsigned long long cudaSurfaceObject_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0, cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2, cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
};
enum cudaMemoryType { cudaMemoryTypeUnregistered = 0, cudaMemoryTypeHost = 1, cudaMemoryTypeDevice = 2, cudaMemoryTypeManaged = 3 };
enum cudaLimit {
    cudaLimitStackSize = 0, cudaLimitPrintfFifoSize = 1, cudaLimitMallocHeapSize = 2, cudaLimitDevRuntimeSyncDepth = 3,
    cudaLimitDevRuntimePendingLaunchCount = 4, cudaLimitMaxL2FetchGranularity = 5, cudaLimitPersistingL2CacheSize = 6
};
enum cudaFuncCache {
    cudaFuncCachePreferNone = 0, cudaFuncCachePreferShared = 1, cudaFuncCachePreferL1 = 2, cudaFuncCachePreferEqual = 3
};
enum cudaSharedMemConfig {
    cudaSharedMemBankSizeDefault = 0, cudaSharedMemBankSizeFourByte = 1, cudaSharedMemBankSizeEightByte = 2
};
// the attributes cudaFuncSetAttribute sets (0 to 7 are unused in every CUDA 12 and 13)
enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8, cudaFuncAttributePreferredSharedMemoryCarveout = 9,
    cudaFuncAttributeClusterDimMustBeSet = 10, cudaFuncAttributeRequiredClusterWidth = 11,
    cudaFuncAttributeRequiredClusterHeight = 12, cudaFuncAttributeRequiredClusterDepth = 13,
    cudaFuncAttributeNonPortableClusterSizeAllowed = 14, cudaFuncAttributeClusterSchedulingPolicyPreference = 15
};
enum cudaAccessProperty { cudaAccessPropertyNormal = 0, cudaAccessPropertyStreaming = 1, cudaAccessPropertyPersisting = 2 };
enum cudaStreamCaptureStatus {
    cudaStreamCaptureStatusNone = 0, cudaStreamCaptureStatusActive = 1, cudaStreamCaptureStatusInvalidated = 2
};
enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal = 0, cudaStreamCaptureModeThreadLocal = 1, cudaStreamCaptureModeRelaxed = 2
};
enum cudaComputeMode {
    cudaComputeModeDefault = 0, cudaComputeModeExclusive = 1, cudaComputeModeProhibited = 2,
    cudaComputeModeExclusiveProcess = 3
};
enum cudaRoundMode { cudaRoundNearest = 0, cudaRoundZero = 1, cudaRoundPosInf = 2, cudaRoundMinInf = 3 };
// the element kinds of a cudaChannelFormatDesc (the block-compressed and video kinds left out)
enum cudaChannelFormatKind {
    cudaChannelFormatKindSigned = 0, cudaChannelFormatKindUnsigned = 1, cudaChannelFormatKindFloat = 2,
    cudaChannelFormatKindNone = 3
};
// library_types.h: the element types cuBLAS, cuSPARSE, ... take, under both of its names
typedef enum cudaDataType_t {
    CUDA_R_32F = 0, CUDA_R_64F = 1, CUDA_R_16F = 2, CUDA_R_8I = 3, CUDA_C_32F = 4, CUDA_C_64F = 5, CUDA_C_16F = 6,
    CUDA_C_8I = 7, CUDA_R_8U = 8, CUDA_C_8U = 9, CUDA_R_32I = 10, CUDA_C_32I = 11, CUDA_R_32U = 12, CUDA_C_32U = 13,
    CUDA_R_16BF = 14, CUDA_C_16BF = 15, CUDA_R_4I = 16, CUDA_C_4I = 17, CUDA_R_4U = 18, CUDA_C_4U = 19,
    CUDA_R_16I = 20, CUDA_C_16I = 21, CUDA_R_16U = 22, CUDA_C_16U = 23, CUDA_R_64I = 24, CUDA_C_64I = 25,
    CUDA_R_64U = 26, CUDA_C_64U = 27, CUDA_R_8F_E4M3 = 28, CUDA_R_8F_E5M2 = 29
} cudaDataType;
typedef enum cudaDataType_t cudaDataType_t;

enum cudaDeviceAttr {
    cudaDevAttrMaxThreadsPerBlock = 1, cudaDevAttrMaxBlockDimX = 2, cudaDevAttrMaxBlockDimY = 3,
    cudaDevAttrMaxBlockDimZ = 4, cudaDevAttrMaxGridDimX = 5, cudaDevAttrMaxGridDimY = 6, cudaDevAttrMaxGridDimZ = 7,
    cudaDevAttrMaxSharedMemoryPerBlock = 8, cudaDevAttrTotalConstantMemory = 9, cudaDevAttrWarpSize = 10,
    cudaDevAttrMaxPitch = 11, cudaDevAttrMaxRegistersPerBlock = 12, cudaDevAttrClockRate = 13,
    cudaDevAttrTextureAlignment = 14, cudaDevAttrGpuOverlap = 15, cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrKernelExecTimeout = 17, cudaDevAttrIntegrated = 18, cudaDevAttrCanMapHostMemory = 19,
    cudaDevAttrComputeMode = 20, cudaDevAttrMaxTexture1DWidth = 21, cudaDevAttrMaxTexture2DWidth = 22,
    cudaDevAttrMaxTexture2DHeight = 23, cudaDevAttrMaxTexture3DWidth = 24, cudaDevAttrMaxTexture3DHeight = 25,
    cudaDevAttrMaxTexture3DDepth = 26, cudaDevAttrMaxTexture2DLayeredWidth = 27,
    cudaDevAttrMaxTexture2DLayeredHeight = 28, cudaDevAttrMaxTexture2DLayeredLayers = 29,
    cudaDevAttrSurfaceAlignment = 30, cudaDevAttrConcurrentKernels = 31, cudaDevAttrEccEnabled = 32,
    cudaDevAttrPciBusId = 33, cudaDevAttrPciDeviceId = 34, cudaDevAttrTccDriver = 35, cudaDevAttrMemoryClockRate = 36,
    cudaDevAttrGlobalMemoryBusWidth = 37, cudaDevAttrL2CacheSize = 38, cudaDevAttrMaxThreadsPerMultiProcessor = 39,
    cudaDevAttrAsyncEngineCount = 40, cudaDevAttrUnifiedAddressing = 41, cudaDevAttrMaxTexture1DLayeredWidth = 42,
    cudaDevAttrMaxTexture1DLayeredLayers = 43, cudaDevAttrMaxTexture2DGatherWidth = 45,
    cudaDevAttrMaxTexture2DGatherHeight = 46, cudaDevAttrMaxTexture3DWidthAlt = 47,
    cudaDevAttrMaxTexture3DHeightAlt = 48, cudaDevAttrMaxTexture3DDepthAlt = 49, cudaDevAttrPciDomainId = 50,
    cudaDevAttrTexturePitchAlignment = 51, cudaDevAttrMaxTextureCubemapWidth = 52,
    cudaDevAttrMaxTextureCubemapLayeredWidth = 53, cudaDevAttrMaxTextureCubemapLayeredLayers = 54,
    cudaDevAttrMaxSurface1DWidth = 55, cudaDevAttrMaxSurface2DWidth = 56, cudaDevAttrMaxSurface2DHeight = 57,
    cudaDevAttrMaxSurface3DWidth = 58, cudaDevAttrMaxSurface3DHeight = 59, cudaDevAttrMaxSurface3DDepth = 60,
    cudaDevAttrMaxSurface1DLayeredWidth = 61, cudaDevAttrMaxSurface1DLayeredLayers = 62,
    cudaDevAttrMaxSurface2DLayeredWidth = 63, cudaDevAttrMaxSurface2DLayeredHeight = 64,
    cudaDevAttrMaxSurface2DLayeredLayers = 65, cudaDevAttrMaxSurfaceCubemapWidth = 66,
    cudaDevAttrMaxSurfaceCubemapLayeredWidth = 67, cudaDevAttrMaxSurfaceCubemapLayeredLayers = 68,
    cudaDevAttrMaxTexture1DLinearWidth = 69, cudaDevAttrMaxTexture2DLinearWidth = 70,
    cudaDevAttrMaxTexture2DLinearHeight = 71, cudaDevAttrMaxTexture2DLinearPitch = 72,
    cudaDevAttrMaxTexture2DMipmappedWidth = 73, cudaDevAttrMaxTexture2DMipmappedHeight = 74,
    cudaDevAttrComputeCapabilityMajor = 75, cudaDevAttrComputeCapabilityMinor = 76,
    cudaDevAttrMaxTexture1DMipmappedWidth = 77, cudaDevAttrStreamPrioritiesSupported = 78,
    cudaDevAttrGlobalL1CacheSupported = 79, cudaDevAttrLocalL1CacheSupported = 80,
    cudaDevAttrMaxSharedMemoryPerMultiprocessor = 81, cudaDevAttrMaxRegistersPerMultiprocessor = 82,
    cudaDevAttrManagedMemory = 83, cudaDevAttrIsMultiGpuBoard = 84, cudaDevAttrMultiGpuBoardGroupID = 85,
    cudaDevAttrHostNativeAtomicSupported = 86, cudaDevAttrSingleToDoublePrecisionPerfRatio = 87,
    cudaDevAttrPageableMemoryAccess = 88, cudaDevAttrConcurrentManagedAccess = 89,
    cudaDevAttrComputePreemptionSupported = 90, cudaDevAttrCanUseHostPointerForRegisteredMem = 91,
    cudaDevAttrCooperativeLaunch = 95, cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
    cudaDevAttrCanFlushRemoteWrites = 98, cudaDevAttrHostRegisterSupported = 99,
    cudaDevAttrPageableMemoryAccessUsesHostPageTables = 100, cudaDevAttrDirectManagedMemAccessFromHost = 101,
    cudaDevAttrMaxBlocksPerMultiprocessor = 106, cudaDevAttrMaxPersistingL2CacheSize = 108,
    cudaDevAttrMaxAccessPolicyWindowSize = 109, cudaDevAttrSparseCudaArraySupported = 112,
    cudaDevAttrHostRegisterReadOnlySupported = 113, cudaDevAttrTimelineSemaphoreInteropSupported = 114,
    cudaDevAttrMemoryPoolsSupported = 115, cudaDevAttrGPUDirectRDMASupported = 116,
    cudaDevAttrGPUDirectRDMAWritesOrdering = 118, cudaDevAttrMemoryPoolSupportedHandleTypes = 119,
    cudaDevAttrClusterLaunch = 120, cudaDevAttrDeferredMappingCudaArraySupported = 121,
    cudaDevAttrIpcEventSupport = 125, cudaDevAttrMemSyncDomainCount = 126, cudaDevAttrNumaConfig = 130,
    cudaDevAttrNumaId = 131, cudaDevAttrMpsEnabled = 133, cudaDevAttrHostNumaId = 134
};

struct cudaExtent { size_t width, height, depth; };
struct cudaPos { size_t x, y, z; };
struct cudaPitchedPtr { void* ptr; size_t pitch, xsize, ysize; };
struct cudaChannelFormatDesc { int x, y, z, w; enum cudaChannelFormatKind f; };
struct CUuuid_st { char bytes[16]; };
typedef struct CUuuid_st cudaUUID_t;
// what cudaFuncGetAttributes reports (the fields of every CUDA 12 and 13; their reserved tails differ)
struct cudaFuncAttributes {
    size_t sharedSizeBytes, constSizeBytes, localSizeBytes;
    int maxThreadsPerBlock, numRegs, ptxVersion, binaryVersion, cacheModeCA, maxDynamicSharedSizeBytes,
        preferredShmemCarveout, clusterDimMustBeSet, requiredClusterWidth, requiredClusterHeight, requiredClusterDepth,
        clusterSchedulingPolicyPreference, nonPortableClusterSizeAllowed;
};
// What cudaGetDeviceProperties reports, as far as a kernel handed one could read it: the fields every CUDA 12
// and 13 has (CUDA 13 removed clockRate, computeMode, ...). sizeof(cudaDeviceProp) is not NVRTC's, which
// differs between CUDA releases itself.
struct cudaDeviceProp {
    char name[256];
    cudaUUID_t uuid;
    size_t totalGlobalMem, sharedMemPerBlock;
    int regsPerBlock, warpSize;
    size_t memPitch;
    int maxThreadsPerBlock, maxThreadsDim[3], maxGridSize[3];
    size_t totalConstMem;
    int major, minor, multiProcessorCount, l2CacheSize, persistingL2CacheMaxSize, maxThreadsPerMultiProcessor;
    size_t sharedMemPerMultiprocessor;
    int regsPerMultiprocessor, managedMemory, concurrentKernels, cooperativeLaunch;
    size_t sharedMemPerBlockOptin, reservedSharedMemPerBlock;
    int maxBlocksPerMultiProcessor, memoryBusWidth, pciBusID, pciDeviceID, pciDomainID, integrated, unifiedAddressing,
        asyncEngineCount, accessPolicyMaxWindowSize, clusterLaunch;
};
