# Small helpers so that each folder's CMakeLists.txt stays a list of sources.
include(GoogleTest)

set(MOE_WARNINGS -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers)
# Our targets only (moe_add_*): generated protobuf code and the system's
# headers keep their warnings as warnings.
if(MOE_WERROR)
  list(APPEND MOE_WARNINGS -Werror)
  if(MOE_SANITIZE)
    # GCC 12 with -fsanitize=address reports std::regex's and std::function's
    # own members as maybe-uninitialized (inlined libstdc++ code, seen in
    # common/model_maker.cc): a warning still, not an error.
    list(APPEND MOE_WARNINGS -Wno-error=maybe-uninitialized)
  endif()
endif()

if(MOE_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer
                      -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
endif()

# Adds `target` to the binaries that the quick_tests target builds
# (tests/CMakeLists.txt defines it once every folder has been added).
function(moe_mark_quick target)
  set_property(GLOBAL APPEND PROPERTY MOE_QUICK_TARGETS ${target})
endfunction()

# moe_add_library(NAME SOURCES ... DEPS ...)
function(moe_add_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR})
  target_compile_options(${name} PRIVATE ${MOE_WARNINGS})
  target_link_libraries(${name} PUBLIC ${ARG_DEPS})
endfunction()

# moe_add_executable(NAME SOURCES ... DEPS ...)
function(moe_add_executable name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR})
  target_compile_options(${name} PRIVATE ${MOE_WARNINGS})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS})
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bin)
endfunction()

# moe_add_test(NAME SOURCES ... DEPS ... [LABELS ...] [TIMEOUT s] [QUICK])
# One GoogleTest binary; each TEST becomes its own ctest entry. QUICK puts
# it in the sanitizer pass that CI runs after the full suite
# (`scripts/test.sh --sanitize --quick`: label "quick", built by the target
# quick_tests): parsers, malformed input, fuzzing, the services' input
# handling, concurrency and faults.
function(moe_add_test name)
  cmake_parse_arguments(ARG "QUICK" "TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  if(ARG_QUICK)
    list(APPEND ARG_LABELS quick)
    moe_mark_quick(${name})
  endif()
  add_executable(${name} ${ARG_SOURCES})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR})
  target_compile_options(${name} PRIVATE ${MOE_WARNINGS})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} moe_test_main)
  target_compile_definitions(${name} PRIVATE
    MOE_SOURCE_DIR="${PROJECT_SOURCE_DIR}" MOE_BINARY_DIR="${PROJECT_BINARY_DIR}")
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  gtest_discover_tests(${name}
    WORKING_DIRECTORY ${PROJECT_BINARY_DIR}
    DISCOVERY_MODE PRE_TEST
    PROPERTIES TIMEOUT ${ARG_TIMEOUT} LABELS "${ARG_LABELS}")
endfunction()
