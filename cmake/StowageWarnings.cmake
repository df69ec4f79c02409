# Warnings are errors in stowage's own code (not in third-party headers, which are included as
# system headers by their imported targets).
function(stowage_target_warnings target)
  target_compile_options(${target} PRIVATE
    -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wsign-conversion -Wold-style-cast
    -Wnon-virtual-dtor -Woverloaded-virtual -Wnull-dereference -Wimplicit-fallthrough
    -Werror)
endfunction()
