// Where the kernel's source starts (sim/compiler.py includes it there): std:: and the host C library as NVRTC has
// them without an include (NAMES_NVRTC_LACKS in sim/compiler.py, which lists the same names). `std` is a
// namespace holding only what NVRTC's holds, and each name NVRTC lacks is renamed to one nothing declares,
// unless the options define it (-D); the emulator's headers turn the renames off inside
// (llmcupy_sim_nvrtc_names_off.h and _on.h). The underscores keep g++ from suggesting these names.
#pragma once
namespace __llmcupy_sim_nvrtc_std { using ::std::move; using ::std::forward; using ::std::initializer_list; using ::std::align_val_t; }
#define std __llmcupy_sim_nvrtc_std
// glibc defines these as macros of themselves, and FP_NAN, ... as macros of their enumerators' values: the names
// are renamed below, which hides glibc's variables and enumerators from the kernel as well
#undef stderr
#undef stdout
#undef stdin
#undef FP_NAN
#undef FP_INFINITE
#undef FP_ZERO
#undef FP_SUBNORMAL
#undef FP_NORMAL
#ifndef int8_t
#define int8_t llmcupy_nvrtc_no_int8_t
#endif
#ifndef int16_t
#define int16_t llmcupy_nvrtc_no_int16_t
#endif
#ifndef int32_t
#define int32_t llmcupy_nvrtc_no_int32_t
#endif
#ifndef int64_t
#define int64_t llmcupy_nvrtc_no_int64_t
#endif
#ifndef int_least8_t
#define int_least8_t llmcupy_nvrtc_no_int_least8_t
#endif
#ifndef int_least16_t
#define int_least16_t llmcupy_nvrtc_no_int_least16_t
#endif
#ifndef int_least32_t
#define int_least32_t llmcupy_nvrtc_no_int_least32_t
#endif
#ifndef int_least64_t
#define int_least64_t llmcupy_nvrtc_no_int_least64_t
#endif
#ifndef int_fast8_t
#define int_fast8_t llmcupy_nvrtc_no_int_fast8_t
#endif
#ifndef int_fast16_t
#define int_fast16_t llmcupy_nvrtc_no_int_fast16_t
#endif
#ifndef int_fast32_t
#define int_fast32_t llmcupy_nvrtc_no_int_fast32_t
#endif
#ifndef int_fast64_t
#define int_fast64_t llmcupy_nvrtc_no_int_fast64_t
#endif
#ifndef uint8_t
#define uint8_t llmcupy_nvrtc_no_uint8_t
#endif
#ifndef uint16_t
#define uint16_t llmcupy_nvrtc_no_uint16_t
#endif
#ifndef uint32_t
#define uint32_t llmcupy_nvrtc_no_uint32_t
#endif
#ifndef uint64_t
#define uint64_t llmcupy_nvrtc_no_uint64_t
#endif
#ifndef uint_least8_t
#define uint_least8_t llmcupy_nvrtc_no_uint_least8_t
#endif
#ifndef uint_least16_t
#define uint_least16_t llmcupy_nvrtc_no_uint_least16_t
#endif
#ifndef uint_least32_t
#define uint_least32_t llmcupy_nvrtc_no_uint_least32_t
#endif
#ifndef uint_least64_t
#define uint_least64_t llmcupy_nvrtc_no_uint_least64_t
#endif
#ifndef uint_fast8_t
#define uint_fast8_t llmcupy_nvrtc_no_uint_fast8_t
#endif
#ifndef uint_fast16_t
#define uint_fast16_t llmcupy_nvrtc_no_uint_fast16_t
#endif
#ifndef uint_fast32_t
#define uint_fast32_t llmcupy_nvrtc_no_uint_fast32_t
#endif
#ifndef uint_fast64_t
#define uint_fast64_t llmcupy_nvrtc_no_uint_fast64_t
#endif
#ifndef intmax_t
#define intmax_t llmcupy_nvrtc_no_intmax_t
#endif
#ifndef uintmax_t
#define uintmax_t llmcupy_nvrtc_no_uintmax_t
#endif
#ifndef intptr_t
#define intptr_t llmcupy_nvrtc_no_intptr_t
#endif
#ifndef uintptr_t
#define uintptr_t llmcupy_nvrtc_no_uintptr_t
#endif
#ifndef exit
#define exit llmcupy_nvrtc_no_exit
#endif
#ifndef abort
#define abort llmcupy_nvrtc_no_abort
#endif
#ifndef atexit
#define atexit llmcupy_nvrtc_no_atexit
#endif
#ifndef rand
#define rand llmcupy_nvrtc_no_rand
#endif
#ifndef srand
#define srand llmcupy_nvrtc_no_srand
#endif
#ifndef time
#define time llmcupy_nvrtc_no_time
#endif
#ifndef puts
#define puts llmcupy_nvrtc_no_puts
#endif
#ifndef putchar
#define putchar llmcupy_nvrtc_no_putchar
#endif
#ifndef fprintf
#define fprintf llmcupy_nvrtc_no_fprintf
#endif
#ifndef sprintf
#define sprintf llmcupy_nvrtc_no_sprintf
#endif
#ifndef snprintf
#define snprintf llmcupy_nvrtc_no_snprintf
#endif
#ifndef stderr
#define stderr llmcupy_nvrtc_no_stderr
#endif
#ifndef stdout
#define stdout llmcupy_nvrtc_no_stdout
#endif
#ifndef fopen
#define fopen llmcupy_nvrtc_no_fopen
#endif
#ifndef fflush
#define fflush llmcupy_nvrtc_no_fflush
#endif
#ifndef atoi
#define atoi llmcupy_nvrtc_no_atoi
#endif
#ifndef atof
#define atof llmcupy_nvrtc_no_atof
#endif
#ifndef strtol
#define strtol llmcupy_nvrtc_no_strtol
#endif
#ifndef getenv
#define getenv llmcupy_nvrtc_no_getenv
#endif
#ifndef qsort
#define qsort llmcupy_nvrtc_no_qsort
#endif
#ifndef strcpy
#define strcpy llmcupy_nvrtc_no_strcpy
#endif
#ifndef strncpy
#define strncpy llmcupy_nvrtc_no_strncpy
#endif
#ifndef strcmp
#define strcmp llmcupy_nvrtc_no_strcmp
#endif
#ifndef strlen
#define strlen llmcupy_nvrtc_no_strlen
#endif
#ifndef memcmp
#define memcmp llmcupy_nvrtc_no_memcmp
#endif
#ifndef calloc
#define calloc llmcupy_nvrtc_no_calloc
#endif
#ifndef realloc
#define realloc llmcupy_nvrtc_no_realloc
#endif
#ifndef stdin
#define stdin llmcupy_nvrtc_no_stdin
#endif
#ifndef FP_NAN
#define FP_NAN llmcupy_nvrtc_no_FP_NAN
#endif
#ifndef FP_INFINITE
#define FP_INFINITE llmcupy_nvrtc_no_FP_INFINITE
#endif
#ifndef FP_ZERO
#define FP_ZERO llmcupy_nvrtc_no_FP_ZERO
#endif
#ifndef FP_SUBNORMAL
#define FP_SUBNORMAL llmcupy_nvrtc_no_FP_SUBNORMAL
#endif
#ifndef FP_NORMAL
#define FP_NORMAL llmcupy_nvrtc_no_FP_NORMAL
#endif
#ifndef isgreater
#define isgreater llmcupy_nvrtc_no_isgreater
#endif
#ifndef isgreaterequal
#define isgreaterequal llmcupy_nvrtc_no_isgreaterequal
#endif
#ifndef isless
#define isless llmcupy_nvrtc_no_isless
#endif
#ifndef islessequal
#define islessequal llmcupy_nvrtc_no_islessequal
#endif
#ifndef islessgreater
#define islessgreater llmcupy_nvrtc_no_islessgreater
#endif
