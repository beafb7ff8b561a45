# The executor's device-independent core (docs/backend.md, "Executor"): the Device seam, the
# scheduling of StepGraph ops on rank threads, and the fake device with a host clock. Included from
# the top-level CMakeLists (not backend/CMakeLists.txt, which only CUDA builds add) so that it builds
# and is tested without CUDA (tests/backend/executor). The CUDA device and the launcher are in
# backend/CMakeLists.txt (target threewalls_backend_run).
add_library(threewalls_executor
  ${CMAKE_CURRENT_LIST_DIR}/src/caching_allocator.cpp
  ${CMAKE_CURRENT_LIST_DIR}/src/executor.cpp
  ${CMAKE_CURRENT_LIST_DIR}/src/fake_device.cpp
  ${CMAKE_CURRENT_LIST_DIR}/src/saved_activations.cpp
  ${CMAKE_CURRENT_LIST_DIR}/src/host_speed.cpp)
add_library(threewalls::executor ALIAS threewalls_executor)
target_include_directories(threewalls_executor PUBLIC ${CMAKE_CURRENT_LIST_DIR}/include)
target_link_libraries(threewalls_executor
  PUBLIC threewalls::scenarios threewalls::profiler threewalls::profiler_recorder threewalls::records threewalls::core
  PRIVATE Threads::Threads)
threewalls_warnings(threewalls_executor)
