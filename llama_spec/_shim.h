/* The shim's C/C++ header: llama.h, then the declarations from _cdef/90_shim.h (their single
 * source, also read by cffi) with C linkage. _shim.cpp and cffi's generated module include it. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "llama.h"

#ifdef __cplusplus
extern "C" {
#endif

#include "_cdef/90_shim.h"

#ifdef __cplusplus
}
#endif
