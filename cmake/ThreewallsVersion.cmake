# The git sha is written at build time by cmake/WriteGitSha.cmake (see core/CMakeLists.txt).
