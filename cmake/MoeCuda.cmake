# CUDA is optional. When nvcc exists the CUDA backend is built as a shared
# module (libmoe_cuda.so) that executables dlopen at run time: they link no
# CUDA library, run on machines without one, and avoid the static-TLS clash
# between libcublasLt (~94 KiB of static TLS) and prometheus-cpp's civetweb
# threads (~100 KiB stacks), which made the metrics server fail to start.
set(MOE_HAVE_CUDA OFF)
if(MOE_WITH_CUDA AND NOT MOE_SANITIZE)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 80 90)
    endif()
    enable_language(CUDA)
    set(CMAKE_CUDA_STANDARD 17)
    find_package(CUDAToolkit)
    if(CUDAToolkit_FOUND)
      set(MOE_HAVE_CUDA ON)
    endif()
  endif()
endif()
message(STATUS "moecache: CUDA module ${MOE_HAVE_CUDA}")
