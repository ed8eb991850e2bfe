/* libg4.so has no code of its own: the runtime archive is linked in whole (cmake/install.cmake). A
   library target needs a source file. */
typedef int g4_shared_no_code;
