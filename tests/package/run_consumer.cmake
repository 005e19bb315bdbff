# Installs depthkv into a scratch prefix, then configures, builds and runs two consumers:
# one with find_package(depthkv CONFIG REQUIRED), one with add_subdirectory().
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
endfunction()
run(${CMAKE_COMMAND} --install ${DEPTHKV_BINARY_DIR} --prefix ${prefix})
foreach(mode find_package add_subdirectory)
  set(b ${WORK_DIR}/build_${mode})
  run(${CMAKE_COMMAND} -S ${DEPTHKV_SOURCE_DIR}/tests/package/consumer -B ${b}
      -DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER} -DCMAKE_PREFIX_PATH=${prefix}
      -DCONSUMER_MODE=${mode} -DDEPTHKV_SOURCE_DIR=${DEPTHKV_SOURCE_DIR} -DDEPTHKV_ENABLE_CUDA=OFF)
  run(${CMAKE_COMMAND} --build ${b})
  run(${b}/consumer)
  run(${b}/consumer_llama)
  message(STATUS "consumer (${mode}) built and ran")
endforeach()
