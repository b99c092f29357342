# OTFUSE_SANITIZE: build with compiler sanitizers, e.g. -DOTFUSE_SANITIZE=address,undefined
# (a comma-separated list passed to -fsanitize=). Used by .ci/sanitize for the library and for the
# fake CANN runtime (tests/fake_cann includes this file too). Empty (the default): no sanitizer.
#
# UBSan is made fatal (-fno-sanitize-recover): a report must fail the run, not scroll past.
# A sanitized .so runs inside a plain python with the ASan runtime preloaded (.ci/sanitize).

set(OTFUSE_SANITIZE "" CACHE STRING "Sanitizers to build with (comma-separated, e.g. address,undefined)")
set(_otfuse_known_sanitizers address undefined float-cast-overflow float-divide-by-zero)

function(otfuse_sanitize target)
  if(NOT OTFUSE_SANITIZE)
    return()
  endif()
  string(REPLACE "," ";" sanitizers "${OTFUSE_SANITIZE}")
  foreach(sanitizer IN LISTS sanitizers)
    if(NOT sanitizer IN_LIST _otfuse_known_sanitizers)
      message(FATAL_ERROR "otfuse: OTFUSE_SANITIZE entry '${sanitizer}' is not one of ${_otfuse_known_sanitizers}")
    endif()
  endforeach()
  target_compile_options(${target} PRIVATE "-fsanitize=${OTFUSE_SANITIZE}" -fno-sanitize-recover=all
                         -fno-omit-frame-pointer -g)
  target_link_options(${target} PRIVATE "-fsanitize=${OTFUSE_SANITIZE}")
  message(STATUS "otfuse: ${target} built with -fsanitize=${OTFUSE_SANITIZE}")
endfunction()
