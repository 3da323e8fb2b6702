# boundary.cmake: the engine's inside is private (CMakeLists.txt, tport_engine).
# With the include path a file of server/ builds with (INCLUDES, '|'-separated:
# tport_server's, its dependencies' included), every public header of the
# engine (engine/include) compiles, and every private one (engine/*.h,
# engine/cuda/*.h) is not found.  The public ones first: they prove the
# path is the real one, so that a private header's absence means something.
#   cmake -DCC=<compiler> -DINCLUDES=<a|b|...> -DENGINE_DIR=<engine/> -DWORK=<dir> -P boundary.cmake
string(REPLACE "|" ";" include_dirs "${INCLUDES}")
set(flags -fsyntax-only)
foreach(dir IN LISTS include_dirs)
  list(APPEND flags "-I${dir}")
endforeach()
file(MAKE_DIRECTORY "${WORK}")

function(compile header out_rc out_log)
  get_filename_component(name "${header}" NAME)
  set(src "${WORK}/includes_${name}.c")
  file(WRITE "${src}" "#include \"${name}\"\n")
  execute_process(COMMAND ${CC} ${flags} -c "${src}" RESULT_VARIABLE rc OUTPUT_VARIABLE o
                  ERROR_VARIABLE e)
  set(${out_rc} "${rc}" PARENT_SCOPE)
  set(${out_log} "${o}${e}" PARENT_SCOPE)
endfunction()

file(GLOB public_headers "${ENGINE_DIR}/include/*.h")
file(GLOB private_headers "${ENGINE_DIR}/*.h" "${ENGINE_DIR}/cuda/*.h")
list(LENGTH public_headers npublic)
list(LENGTH private_headers nprivate)
if(npublic EQUAL 0 OR nprivate EQUAL 0)
  message(FATAL_ERROR "no headers under ${ENGINE_DIR}: ${npublic} public, ${nprivate} private")
endif()
foreach(h IN LISTS public_headers)
  compile("${h}" rc log)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "public ${h} does not compile with the server's include path:\n${log}")
  endif()
endforeach()
foreach(h IN LISTS private_headers)
  get_filename_component(name "${h}" NAME)
  compile("${h}" rc log)
  if(rc EQUAL 0 OR NOT log MATCHES "${name}: No such file")
    message(FATAL_ERROR "private ${name} is reachable from the server's include path:\n${log}")
  endif()
endforeach()
message(STATUS "${npublic} public engine headers compile, ${nprivate} private ones are out of reach")
