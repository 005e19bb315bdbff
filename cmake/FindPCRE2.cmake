# FindPCRE2: the 8-bit PCRE2 library (Debian: libpcre2-dev), for depthkv::llama's byte-level BPE
# pre-tokenizers. Tries pkg-config (libpcre2-8) first, then find_path/find_library.
# Defines PCRE2_FOUND, PCRE2_VERSION (when pkg-config knows it) and the imported target
# PCRE2::pcre2-8 (include directory + library).
if(TARGET PCRE2::pcre2-8)
  set(PCRE2_FOUND TRUE)
  return()
endif()
find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND)
  pkg_check_modules(PC_PCRE2 QUIET libpcre2-8)
endif()
find_path(PCRE2_INCLUDE_DIR NAMES pcre2.h HINTS ${PC_PCRE2_INCLUDEDIR} ${PC_PCRE2_INCLUDE_DIRS})
find_library(PCRE2_LIBRARY NAMES pcre2-8 libpcre2-8 HINTS ${PC_PCRE2_LIBDIR} ${PC_PCRE2_LIBRARY_DIRS})
if(PC_PCRE2_VERSION)
  set(PCRE2_VERSION ${PC_PCRE2_VERSION})
endif()
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(PCRE2 REQUIRED_VARS PCRE2_LIBRARY PCRE2_INCLUDE_DIR VERSION_VAR PCRE2_VERSION)
if(PCRE2_FOUND)
  add_library(PCRE2::pcre2-8 UNKNOWN IMPORTED)
  set_target_properties(PCRE2::pcre2-8 PROPERTIES
    IMPORTED_LOCATION "${PCRE2_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${PCRE2_INCLUDE_DIR}")
endif()
mark_as_advanced(PCRE2_INCLUDE_DIR PCRE2_LIBRARY)
