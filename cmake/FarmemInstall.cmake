# Installation: `cmake --install <build> [--prefix P]` puts
#
#   bin/farmemctl, sbin/farmemd            the programs
#   lib/libfarmem_*.a, lib/libfarmem_preload.so
#   include/farmem/...                     farmem.h / farmem.hpp and the
#                                          runtime/ pager/ allocator/ headers
#                                          they need ("runtime/wire.h" works
#                                          with include/farmem on the path)
#   lib/cmake/farmem/                      find_package(farmem): farmem::runtime,
#                                          farmem::donor, farmem::pager, ...
#   lib/pkgconfig/farmem.pc                pkg-config --cflags --libs farmem
#                                          (farmem-donor, farmem-api: the C API)
#   lib/systemd/system/farmemd.service     + etc/farmem/farmemd.env
#   share/man/man1/farmemctl.1, share/man/man8/farmemd.8
#
# Every target is referenced only if this build defines it, so the rules
# follow the tree as it grows. Included last from the top-level
# CMakeLists.txt, once every target exists.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(FARMEM_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/farmem)
set(FARMEM_INSTALL_SYSTEMDDIR lib/systemd/system
    CACHE STRING "Where farmemd.service is installed (relative to the prefix)")

# Libraries exported as farmem::<name>, in dependency order.
set(_farmem_libs "")
foreach(_pair runtime:farmem_runtime verbs:farmem_verbs donor:farmem_donor pager:farmem_pager
              allocator:farmem_allocator)
  string(REPLACE ":" ";" _pair "${_pair}")
  list(GET _pair 0 _name)
  list(GET _pair 1 _tgt)
  if(TARGET ${_tgt})
    set_target_properties(${_tgt} PROPERTIES EXPORT_NAME ${_name})
    list(APPEND _farmem_libs ${_tgt})
  endif()
endforeach()

# The allocator links a private, renamed copy of jemalloc by its path in
# the build tree; installed, it is lib/libfarmem_jemalloc.a instead.
if(TARGET farmem_allocator)
  get_target_property(_links farmem_allocator INTERFACE_LINK_LIBRARIES)
  set(_fixed "")
  foreach(_l IN LISTS _links)
    if(_l MATCHES "libfarmem_jemalloc\\.a$")
      install(FILES ${_l} DESTINATION ${CMAKE_INSTALL_LIBDIR})
      list(APPEND _fixed "$<BUILD_INTERFACE:${_l}>"
           "$<INSTALL_INTERFACE:\${_IMPORT_PREFIX}/${CMAKE_INSTALL_LIBDIR}/libfarmem_jemalloc.a>")
    else()
      list(APPEND _fixed "${_l}")
    endif()
  endforeach()
  set_property(TARGET farmem_allocator PROPERTY INTERFACE_LINK_LIBRARIES "${_fixed}")
endif()

install(TARGETS ${_farmem_libs}
  EXPORT farmemTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} ${CMAKE_INSTALL_INCLUDEDIR}/farmem)
install(EXPORT farmemTargets NAMESPACE farmem:: DESTINATION ${FARMEM_INSTALL_CMAKEDIR})

if(TARGET farmemd)
  install(TARGETS farmemd RUNTIME DESTINATION ${CMAKE_INSTALL_SBINDIR})
endif()
if(TARGET farmemctl)
  install(TARGETS farmemctl RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
if(TARGET farmem_preload)
  # Loaded by path (LD_PRELOAD), never linked against: not exported.
  install(TARGETS farmem_preload LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()

# Headers: the public C/C++ API, and the internal headers the exported
# libraries' API uses ("runtime/...", "pager/...", "allocator/...").
if(EXISTS ${PROJECT_SOURCE_DIR}/include/farmem)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/farmem/
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/farmem FILES_MATCHING PATTERN "*.h" PATTERN "*.hpp")
endif()
foreach(_dir runtime pager allocator)
  if((_dir STREQUAL "runtime") OR (_dir STREQUAL "pager" AND TARGET farmem_pager) OR
     (_dir STREQUAL "allocator" AND TARGET farmem_allocator))
    install(DIRECTORY ${PROJECT_SOURCE_DIR}/${_dir}/
            DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/farmem/${_dir} FILES_MATCHING PATTERN "*.h")
  endif()
endforeach()

# find_package(farmem): the config recreates the imported dependencies the
# exported targets name (PkgConfig::FARMEM_*).
set(FARMEM_EXPORT_VERBS OFF)
if(TARGET farmem_verbs)
  set(FARMEM_EXPORT_VERBS ON)
endif()
configure_package_config_file(${PROJECT_SOURCE_DIR}/packaging/farmemConfig.cmake.in
  ${PROJECT_BINARY_DIR}/packaging/farmemConfig.cmake
  INSTALL_DESTINATION ${FARMEM_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/packaging/farmemConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/packaging/farmemConfig.cmake
              ${PROJECT_BINARY_DIR}/packaging/farmemConfigVersion.cmake
        DESTINATION ${FARMEM_INSTALL_CMAKEDIR})

# pkg-config: the runtime library (control client, transports, wire),
# as farmem-donor the donor library, and as farmem-api the far-memory API. prefix is found relative to the .pc
# file, so `cmake --install --prefix P` gives working files.
set(FARMEM_PC_VERBS_LIBS "")
set(FARMEM_PC_VERBS_REQUIRES "")
if(FARMEM_EXPORT_VERBS)
  set(FARMEM_PC_VERBS_LIBS "-lfarmem_verbs")
  set(FARMEM_PC_VERBS_REQUIRES ", libibverbs, librdmacm")
endif()
file(RELATIVE_PATH FARMEM_PC_UP /x/${CMAKE_INSTALL_LIBDIR}/pkgconfig /x)
string(REGEX REPLACE "/$" "" FARMEM_PC_UP "${FARMEM_PC_UP}")
configure_file(${PROJECT_SOURCE_DIR}/packaging/farmem.pc.in
               ${PROJECT_BINARY_DIR}/packaging/farmem.pc @ONLY)
configure_file(${PROJECT_SOURCE_DIR}/packaging/farmem-donor.pc.in
               ${PROJECT_BINARY_DIR}/packaging/farmem-donor.pc @ONLY)
set(_farmem_pcs ${PROJECT_BINARY_DIR}/packaging/farmem.pc
                ${PROJECT_BINARY_DIR}/packaging/farmem-donor.pc)
if(TARGET farmem_allocator)
  configure_file(${PROJECT_SOURCE_DIR}/packaging/farmem-api.pc.in
                 ${PROJECT_BINARY_DIR}/packaging/farmem-api.pc @ONLY)
  list(APPEND _farmem_pcs ${PROJECT_BINARY_DIR}/packaging/farmem-api.pc)
endif()
install(FILES ${_farmem_pcs} DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# The daemon as a service. The unit names absolute paths, so it is
# generated at install time for the prefix actually used. Packagers
# installing to /usr pass -DCMAKE_INSTALL_SYSCONFDIR=/etc (GNUInstallDirs
# keeps it relative, i.e. /usr/etc, otherwise).
install(CODE "
  set(_farmem_prefix \"\${CMAKE_INSTALL_PREFIX}\")
  if(IS_ABSOLUTE \"${CMAKE_INSTALL_SBINDIR}\")
    set(FARMEM_UNIT_SBINDIR \"${CMAKE_INSTALL_SBINDIR}\")
  else()
    set(FARMEM_UNIT_SBINDIR \"\${_farmem_prefix}/${CMAKE_INSTALL_SBINDIR}\")
  endif()
  if(IS_ABSOLUTE \"${CMAKE_INSTALL_SYSCONFDIR}\")
    set(FARMEM_UNIT_SYSCONFDIR \"${CMAKE_INSTALL_SYSCONFDIR}\")
  else()
    set(FARMEM_UNIT_SYSCONFDIR \"\${_farmem_prefix}/${CMAKE_INSTALL_SYSCONFDIR}\")
  endif()
  configure_file(\"${PROJECT_SOURCE_DIR}/packaging/farmemd.service.in\"
                 \"${PROJECT_BINARY_DIR}/packaging/farmemd.service\" @ONLY)
")
install(FILES ${PROJECT_BINARY_DIR}/packaging/farmemd.service
        DESTINATION ${FARMEM_INSTALL_SYSTEMDDIR})
install(FILES ${PROJECT_SOURCE_DIR}/packaging/farmemd.env
        DESTINATION ${CMAKE_INSTALL_SYSCONFDIR}/farmem)

# Man pages.
install(FILES ${PROJECT_SOURCE_DIR}/packaging/farmemctl.1
        DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
install(FILES ${PROJECT_SOURCE_DIR}/packaging/farmemd.8
        DESTINATION ${CMAKE_INSTALL_MANDIR}/man8)
