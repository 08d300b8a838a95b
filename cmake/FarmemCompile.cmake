# One list of warnings and sanitizer flags, applied per target with
# farmem_target_defaults(<target>).

set(FARMEM_WARNINGS
    -Wall -Wextra -Wnon-virtual-dtor -Wcast-align -Wunused
    -Woverloaded-virtual -Wnull-dereference -Wdouble-promotion -Wformat=2
    -Wimplicit-fallthrough -Wmissing-declarations)
if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  # clang spells gcc's -Wshadow=local this way (the fuzz build uses clang).
  list(APPEND FARMEM_WARNINGS -Wshadow-uncaptured-local -Wthread-safety)
else()
  list(APPEND FARMEM_WARNINGS -Wshadow=local)
endif()
if(FARMEM_ENABLE_WERROR)
  list(APPEND FARMEM_WARNINGS -Werror)
endif()

set(FARMEM_SANITIZE "")
if(FARMEM_ENABLE_ASAN)
  list(APPEND FARMEM_SANITIZE address)
endif()
if(FARMEM_ENABLE_UBSAN)
  list(APPEND FARMEM_SANITIZE undefined)
endif()
if(FARMEM_ENABLE_TSAN)
  if(FARMEM_ENABLE_ASAN)
    message(FATAL_ERROR "FARMEM_ENABLE_TSAN cannot be combined with FARMEM_ENABLE_ASAN")
  endif()
  list(APPEND FARMEM_SANITIZE thread)
endif()
if(FARMEM_SANITIZE)
  list(JOIN FARMEM_SANITIZE "," _farmem_san)
  # Sanitizers apply to the whole build so that every object agrees.
  add_compile_options(-fsanitize=${_farmem_san} -fno-omit-frame-pointer
                      -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=${_farmem_san})
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # GCC 12 under -fsanitize reports -Wmaybe-uninitialized inside libstdc++
    # (std::function in std::regex) that the plain build does not; the plain
    # build keeps that warning an error.
    list(APPEND FARMEM_WARNINGS -Wno-maybe-uninitialized)
  endif()
endif()

function(farmem_target_defaults target)
  get_target_property(_type ${target} TYPE)
  if(_type STREQUAL "INTERFACE_LIBRARY")
    return()
  endif()
  # One section per function and object: the preload library links with
  # --gc-sections, and every byte of its text left in is resident in the
  # program it runs in (the kernel's fault-around maps a cached library
  # whole), inside the program's memory budget.
  target_compile_options(${target} PRIVATE -ffunction-sections -fdata-sections
    $<$<COMPILE_LANGUAGE:CXX>:${FARMEM_WARNINGS}>
    $<$<COMPILE_LANGUAGE:C>:-Wall -Wextra $<$<BOOL:${FARMEM_ENABLE_WERROR}>:-Werror>>)
  target_include_directories(${target} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>)
endfunction()
