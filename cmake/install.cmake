# libg4.so (the C API with everything it needs linked in) and `cmake --install`: the CLI, the header, the
# shared and static libraries, a CMake package (find_package(g4): g4::g4, g4::g4_static) and pkg-config
# files (g4.pc: the shared library; g4-static.pc: the static runtime). docs/linking.md describes their use.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# The API version of runtime/include/g4/g4.h: the shared library's SONAME carries its major.
file(STRINGS ${PROJECT_SOURCE_DIR}/runtime/include/g4/g4.h G4_API_LINES REGEX "^#define G4_API_VERSION_M")
string(REGEX REPLACE ".*MAJOR ([0-9]+).*" "\\1" G4_API_VERSION_MAJOR "${G4_API_LINES}")
string(REGEX REPLACE ".*MINOR ([0-9]+).*" "\\1" G4_API_VERSION_MINOR "${G4_API_LINES}")

# The runtime archive whole (every C API entry point), the kernels and model definition as it uses them;
# the version script exports g4_* only.
add_library(g4_shared SHARED ${PROJECT_SOURCE_DIR}/cmake/g4_shared.c)
target_link_libraries(g4_shared PRIVATE "-Wl,--whole-archive" g4_runtime "-Wl,--no-whole-archive" g4_kernels
                                        g4_model Threads::Threads ${CMAKE_DL_LIBS})
target_link_options(g4_shared PRIVATE "LINKER:--version-script=${PROJECT_SOURCE_DIR}/cmake/g4.map")
# Every symbol resolved at link time, except in sanitizer builds (the program brings the sanitizer runtime).
if(G4_SANITIZE STREQUAL "")
    target_link_options(g4_shared PRIVATE "LINKER:--no-undefined")
endif()
set_target_properties(g4_shared PROPERTIES
    OUTPUT_NAME g4 LINKER_LANGUAGE CXX
    VERSION ${G4_API_VERSION_MAJOR}.${G4_API_VERSION_MINOR} SOVERSION ${G4_API_VERSION_MAJOR}
    LINK_DEPENDS ${PROJECT_SOURCE_DIR}/cmake/g4.map)

install(TARGETS g4 RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS g4_shared LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS g4_runtime g4_kernels g4_model ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(FILES ${PROJECT_SOURCE_DIR}/runtime/include/g4/g4.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/g4)
install(FILES ${PROJECT_SOURCE_DIR}/tools/example_embed.c DESTINATION ${CMAKE_INSTALL_DATADIR}/g4/examples)

set(G4_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/g4)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/g4Config.cmake.in ${PROJECT_BINARY_DIR}/g4Config.cmake
                              INSTALL_DESTINATION ${G4_CMAKE_DIR}
                              PATH_VARS CMAKE_INSTALL_INCLUDEDIR CMAKE_INSTALL_LIBDIR)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/g4ConfigVersion.cmake VERSION ${PROJECT_VERSION}
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/g4Config.cmake ${PROJECT_BINARY_DIR}/g4ConfigVersion.cmake
        DESTINATION ${G4_CMAKE_DIR})
# The .pc files find the prefix from their own place (pkg-config's ${pcfiledir}): the tree may be installed
# with cmake --install --prefix anywhere, or moved.
# The media decoders' system libraries (libjpeg, FFmpeg's when the build uses them), for static linking.
list(TRANSFORM G4_STATIC_EXTRA_LIBS PREPEND "-l" OUTPUT_VARIABLE G4_PC_EXTRA_LIBS)
list(JOIN G4_PC_EXTRA_LIBS " " G4_PC_EXTRA_LIBS)
file(RELATIVE_PATH G4_PC_UP /x/${CMAKE_INSTALL_LIBDIR}/pkgconfig /x)
set(G4_PC_PREFIX "\${pcfiledir}/${G4_PC_UP}")
foreach(pc g4 g4-static)
    configure_file(${PROJECT_SOURCE_DIR}/cmake/${pc}.pc.in ${PROJECT_BINARY_DIR}/${pc}.pc @ONLY)
    install(FILES ${PROJECT_BINARY_DIR}/${pc}.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endforeach()
