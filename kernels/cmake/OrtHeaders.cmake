# Locates the ONNX Runtime C API header (onnxruntime_c_api.h) and sets OTFUSE_ORT_INCLUDE_DIR.
#
# The library only uses the C API, so this one header is all we need. It is never committed:
#   1. OTFUSE_ORT_INCLUDE_DIR (CMake variable or environment variable) pointing at a directory
#      that contains onnxruntime_c_api.h is used as is.
#   2. Otherwise the header is fetched once into a cache directory outside the source tree
#      (OTFUSE_CACHE_DIR, else $XDG_CACHE_HOME/otfuse, else ~/.cache/otfuse), trying in order:
#      a. the onnxruntime-android AAR from Maven (its headers/ folder), where it is served;
#      b. the Go module github.com/yalue/onnxruntime_go, which ships the C API headers
#         (via `go mod download`, or a direct download from the Go module proxy without `go`).
# Any header with ORT_API_VERSION >= 17 works: kernels request API version 17 at run time.

set(OTFUSE_ORT_MAVEN_VERSION "1.24.0" CACHE STRING "onnxruntime-android AAR version to take headers from")
set(OTFUSE_ORT_GO_MODULE "github.com/yalue/onnxruntime_go")
set(OTFUSE_ORT_GO_VERSION "v1.27.0" CACHE STRING "onnxruntime_go module version (v1.27.0 ships ORT 1.24's header)")
# SHA-256 of the module zip as served by the Go module proxy, so a direct download is verified.
set(OTFUSE_ORT_GO_ZIP_SHA256 "5b7c7e6878caa1f1bf5d5acc09bfdd9de4c2f1e1beee1ff5529570139c540cb0")

function(_otfuse_has_header dir out_var)
  if(dir AND EXISTS "${dir}/onnxruntime_c_api.h")
    set(${out_var} TRUE PARENT_SCOPE)
  else()
    set(${out_var} FALSE PARENT_SCOPE)
  endif()
endfunction()

function(_otfuse_cache_dir out_var)
  if(DEFINED ENV{OTFUSE_CACHE_DIR} AND NOT "$ENV{OTFUSE_CACHE_DIR}" STREQUAL "")
    set(dir "$ENV{OTFUSE_CACHE_DIR}")
  elseif(DEFINED ENV{XDG_CACHE_HOME} AND NOT "$ENV{XDG_CACHE_HOME}" STREQUAL "")
    set(dir "$ENV{XDG_CACHE_HOME}/otfuse")
  elseif(DEFINED ENV{HOME} AND NOT "$ENV{HOME}" STREQUAL "")
    set(dir "$ENV{HOME}/.cache/otfuse")
  else()
    message(FATAL_ERROR "otfuse: no cache directory for the ORT headers: set OTFUSE_CACHE_DIR or OTFUSE_ORT_INCLUDE_DIR")
  endif()
  set(${out_var} "${dir}" PARENT_SCOPE)
endfunction()

# (a) Maven: onnxruntime-android:<ver>:aar holds headers/onnxruntime_c_api.h.
function(_otfuse_fetch_from_maven dest ok_var)
  set(${ok_var} FALSE PARENT_SCOPE)
  find_program(OTFUSE_MVN mvn)
  if(NOT OTFUSE_MVN)
    return()
  endif()
  set(work "${dest}.maven-tmp")
  file(REMOVE_RECURSE "${work}")
  file(MAKE_DIRECTORY "${work}")
  message(STATUS "otfuse: trying onnxruntime-android ${OTFUSE_ORT_MAVEN_VERSION} from Maven")
  execute_process(
    COMMAND "${OTFUSE_MVN}" -q -B dependency:copy
            "-Dartifact=com.microsoft.onnxruntime:onnxruntime-android:${OTFUSE_ORT_MAVEN_VERSION}:aar"
            "-DoutputDirectory=${work}"
    WORKING_DIRECTORY "${work}"
    RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET TIMEOUT 180)
  file(GLOB aar "${work}/*.aar")
  if(NOT rc EQUAL 0 OR NOT aar)
    message(STATUS "otfuse: Maven did not serve the AAR")
    file(REMOVE_RECURSE "${work}")
    return()
  endif()
  file(ARCHIVE_EXTRACT INPUT "${aar}" DESTINATION "${work}/x" PATTERNS "headers/*")
  if(EXISTS "${work}/x/headers/onnxruntime_c_api.h")
    file(MAKE_DIRECTORY "${dest}")
    file(GLOB headers "${work}/x/headers/*.h")
    file(COPY ${headers} DESTINATION "${dest}")
    set(${ok_var} TRUE PARENT_SCOPE)
  endif()
  file(REMOVE_RECURSE "${work}")
endfunction()

# (b) Go module proxy: the onnxruntime_go module ships onnxruntime_c_api.h at its root.
function(_otfuse_fetch_from_go_proxy dest ok_var)
  set(${ok_var} FALSE PARENT_SCOPE)
  set(module_at "${OTFUSE_ORT_GO_MODULE}@${OTFUSE_ORT_GO_VERSION}")
  set(work "${dest}.go-tmp")
  file(REMOVE_RECURSE "${work}")
  file(MAKE_DIRECTORY "${work}")
  set(module_dir "")

  find_program(OTFUSE_GO go)
  if(OTFUSE_GO)
    message(STATUS "otfuse: fetching ${module_at} with go mod download")
    # A private, writable module cache so the fetch never touches (or needs) the user's own.
    execute_process(
      COMMAND "${CMAKE_COMMAND}" -E env "GOMODCACHE=${work}/gomod" GOFLAGS=-modcacherw GOWORK=off GO111MODULE=on
              "${OTFUSE_GO}" mod download -json "${module_at}"
      WORKING_DIRECTORY "${work}"
      RESULT_VARIABLE rc OUTPUT_VARIABLE json ERROR_VARIABLE err TIMEOUT 600)
    if(rc EQUAL 0)
      string(JSON module_dir ERROR_VARIABLE json_err GET "${json}" Dir)
      if(json_err)
        set(module_dir "")
      endif()
    else()
      message(STATUS "otfuse: go mod download failed: ${err}")
    endif()
  endif()

  if(NOT module_dir)
    # Without `go`: the module zip straight from the proxy ($GOPROXY's first URL if set).
    set(proxy "https://proxy.golang.org")
    if(DEFINED ENV{GOPROXY})
      string(REPLACE "," ";" proxies "$ENV{GOPROXY}")
      string(REPLACE "|" ";" proxies "${proxies}")
      foreach(p IN LISTS proxies)
        if(p MATCHES "^https?://")
          string(REGEX REPLACE "/+$" "" proxy "${p}")
          break()
        endif()
      endforeach()
    endif()
    set(url "${proxy}/${OTFUSE_ORT_GO_MODULE}/@v/${OTFUSE_ORT_GO_VERSION}.zip")
    message(STATUS "otfuse: downloading ${url}")
    file(DOWNLOAD "${url}" "${work}/module.zip"
         EXPECTED_HASH SHA256=${OTFUSE_ORT_GO_ZIP_SHA256}
         STATUS dl_status TLS_VERIFY ON)
    list(GET dl_status 0 dl_rc)
    if(NOT dl_rc EQUAL 0)
      message(STATUS "otfuse: download failed: ${dl_status}")
      file(REMOVE_RECURSE "${work}")
      return()
    endif()
    file(ARCHIVE_EXTRACT INPUT "${work}/module.zip" DESTINATION "${work}/x" PATTERNS "*/onnxruntime_*api.h")
    set(module_dir "${work}/x/${module_at}")
  endif()

  if(EXISTS "${module_dir}/onnxruntime_c_api.h")
    # Newer headers include their companions (onnxruntime_ep_c_api.h), so take all of them.
    file(GLOB headers "${module_dir}/onnxruntime_*api.h")
    file(MAKE_DIRECTORY "${dest}")
    file(COPY ${headers} DESTINATION "${dest}")
    set(${ok_var} TRUE PARENT_SCOPE)
  endif()
  file(REMOVE_RECURSE "${work}")
endfunction()

if(NOT OTFUSE_ORT_INCLUDE_DIR AND DEFINED ENV{OTFUSE_ORT_INCLUDE_DIR})
  set(OTFUSE_ORT_INCLUDE_DIR "$ENV{OTFUSE_ORT_INCLUDE_DIR}")
endif()

if(OTFUSE_ORT_INCLUDE_DIR)
  _otfuse_has_header("${OTFUSE_ORT_INCLUDE_DIR}" found)
  if(NOT found)
    message(FATAL_ERROR "otfuse: OTFUSE_ORT_INCLUDE_DIR=${OTFUSE_ORT_INCLUDE_DIR} has no onnxruntime_c_api.h")
  endif()
else()
  _otfuse_cache_dir(cache_dir)
  set(maven_dir "${cache_dir}/ort-headers/maven-${OTFUSE_ORT_MAVEN_VERSION}")
  set(go_dir "${cache_dir}/ort-headers/go-${OTFUSE_ORT_GO_VERSION}")
  _otfuse_has_header("${maven_dir}" have_maven)
  _otfuse_has_header("${go_dir}" have_go)
  if(have_maven)
    set(OTFUSE_ORT_INCLUDE_DIR "${maven_dir}")
  elseif(have_go)
    set(OTFUSE_ORT_INCLUDE_DIR "${go_dir}")
  else()
    _otfuse_fetch_from_maven("${maven_dir}" ok)
    if(ok)
      set(OTFUSE_ORT_INCLUDE_DIR "${maven_dir}")
    else()
      _otfuse_fetch_from_go_proxy("${go_dir}" ok)
      if(ok)
        set(OTFUSE_ORT_INCLUDE_DIR "${go_dir}")
      else()
        message(FATAL_ERROR
          "otfuse: could not fetch onnxruntime_c_api.h (Maven and the Go module proxy both failed). "
          "Point OTFUSE_ORT_INCLUDE_DIR at a directory containing it.")
      endif()
    endif()
  endif()
endif()

message(STATUS "otfuse: ORT C API header from ${OTFUSE_ORT_INCLUDE_DIR}")
