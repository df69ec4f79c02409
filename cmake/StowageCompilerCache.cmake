# Compile through ccache when it is installed. Its cache lives outside the clone (ccache's own
# default, ~/.cache/ccache, or CCACHE_DIR), so a fresh clone and CI rebuild in seconds.
find_program(STOWAGE_CCACHE ccache)
if(STOWAGE_CCACHE)
  set(CMAKE_C_COMPILER_LAUNCHER "${STOWAGE_CCACHE}")
  set(CMAKE_CXX_COMPILER_LAUNCHER "${STOWAGE_CCACHE}")
endif()
