// Which sanitizer this translation unit is compiled with, whichever the compiler: GCC says so with
// __SANITIZE_THREAD__ / __SANITIZE_ADDRESS__, Clang (before 20) only through __has_feature.
// STOWAGE_THREAD_SANITIZER and STOWAGE_ADDRESS_SANITIZER are defined (to 1) accordingly.
#pragma once

#if defined(__SANITIZE_THREAD__)
#define STOWAGE_THREAD_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define STOWAGE_THREAD_SANITIZER 1
#endif
#endif

#if defined(__SANITIZE_ADDRESS__)
#define STOWAGE_ADDRESS_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define STOWAGE_ADDRESS_SANITIZER 1
#endif
#endif
