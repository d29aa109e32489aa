# CMake generated Testfile for 
# Source directory: /work/main
# Build directory: /work/main/build-tests
# 
# This file includes the relevant testing commands required for 
# testing this directory and lists subdirectories to be tested as well.
include("/work/main/build-tests/pyckpt_core_tests_e3b0c442_include.cmake")
