add_test([=[Crc32c.Rfc3720Vectors]=]  /work/main/build-tests/pyckpt_core_tests [==[--gtest_filter=Crc32c.Rfc3720Vectors]==] --gtest_also_run_disabled_tests)
set_tests_properties([=[Crc32c.Rfc3720Vectors]=]
  PROPERTIES
    
    DEF_SOURCE_LINE [==[/work/main/cpp/src/crc32c_test.cc:15]==]
    WORKING_DIRECTORY [==[/work/main/build-tests]==]
    SKIP_REGULAR_EXPRESSION [==[\[  SKIPPED \]]==]
    
)
add_test([=[Crc32c.ExtendEqualsWhole]=]  /work/main/build-tests/pyckpt_core_tests [==[--gtest_filter=Crc32c.ExtendEqualsWhole]==] --gtest_also_run_disabled_tests)
set_tests_properties([=[Crc32c.ExtendEqualsWhole]=]
  PROPERTIES
    
    DEF_SOURCE_LINE [==[/work/main/cpp/src/crc32c_test.cc:34]==]
    WORKING_DIRECTORY [==[/work/main/build-tests]==]
    SKIP_REGULAR_EXPRESSION [==[\[  SKIPPED \]]==]
    
)
add_test([=[Crc32c.HardwareMatchesPortableOnRandomBuffers]=]  /work/main/build-tests/pyckpt_core_tests [==[--gtest_filter=Crc32c.HardwareMatchesPortableOnRandomBuffers]==] --gtest_also_run_disabled_tests)
set_tests_properties([=[Crc32c.HardwareMatchesPortableOnRandomBuffers]=]
  PROPERTIES
    
    DEF_SOURCE_LINE [==[/work/main/cpp/src/crc32c_test.cc:40]==]
    WORKING_DIRECTORY [==[/work/main/build-tests]==]
    SKIP_REGULAR_EXPRESSION [==[\[  SKIPPED \]]==]
    
)
add_test([=[Crc32c.CombineMatchesConcatenation]=]  /work/main/build-tests/pyckpt_core_tests [==[--gtest_filter=Crc32c.CombineMatchesConcatenation]==] --gtest_also_run_disabled_tests)
set_tests_properties([=[Crc32c.CombineMatchesConcatenation]=]
  PROPERTIES
    
    DEF_SOURCE_LINE [==[/work/main/cpp/src/crc32c_test.cc:60]==]
    WORKING_DIRECTORY [==[/work/main/build-tests]==]
    SKIP_REGULAR_EXPRESSION [==[\[  SKIPPED \]]==]
    
)
add_test([=[Crc32c.MaskRoundTripsAndDiffers]=]  /work/main/build-tests/pyckpt_core_tests [==[--gtest_filter=Crc32c.MaskRoundTripsAndDiffers]==] --gtest_also_run_disabled_tests)
set_tests_properties([=[Crc32c.MaskRoundTripsAndDiffers]=]
  PROPERTIES
    
    DEF_SOURCE_LINE [==[/work/main/cpp/src/crc32c_test.cc:72]==]
    WORKING_DIRECTORY [==[/work/main/build-tests]==]
    SKIP_REGULAR_EXPRESSION [==[\[  SKIPPED \]]==]
    
)
add_test([=[Crc32c.ImplementationIsNamed]=]  /work/main/build-tests/pyckpt_core_tests [==[--gtest_filter=Crc32c.ImplementationIsNamed]==] --gtest_also_run_disabled_tests)
set_tests_properties([=[Crc32c.ImplementationIsNamed]=]
  PROPERTIES
    
    DEF_SOURCE_LINE [==[/work/main/cpp/src/crc32c_test.cc:81]==]
    WORKING_DIRECTORY [==[/work/main/build-tests]==]
    SKIP_REGULAR_EXPRESSION [==[\[  SKIPPED \]]==]
    
)
add_test([=[TensorView.Contiguity]=]  /work/main/build-tests/pyckpt_core_tests [==[--gtest_filter=TensorView.Contiguity]==] --gtest_also_run_disabled_tests)
set_tests_properties([=[TensorView.Contiguity]=]
  PROPERTIES
    
    DEF_SOURCE_LINE [==[/work/main/cpp/src/tensor_view_test.cc:30]==]
    WORKING_DIRECTORY [==[/work/main/build-tests]==]
    SKIP_REGULAR_EXPRESSION [==[\[  SKIPPED \]]==]
    
)
add_test([=[TensorView.GatherAnyRangeOfATranspose]=]  /work/main/build-tests/pyckpt_core_tests [==[--gtest_filter=TensorView.GatherAnyRangeOfATranspose]==] --gtest_also_run_disabled_tests)
set_tests_properties([=[TensorView.GatherAnyRangeOfATranspose]=]
  PROPERTIES
    
    DEF_SOURCE_LINE [==[/work/main/cpp/src/tensor_view_test.cc:38]==]
    WORKING_DIRECTORY [==[/work/main/build-tests]==]
    SKIP_REGULAR_EXPRESSION [==[\[  SKIPPED \]]==]
    
)
add_test([=[TensorView.ScatterInvertsGather]=]  /work/main/build-tests/pyckpt_core_tests [==[--gtest_filter=TensorView.ScatterInvertsGather]==] --gtest_also_run_disabled_tests)
set_tests_properties([=[TensorView.ScatterInvertsGather]=]
  PROPERTIES
    
    DEF_SOURCE_LINE [==[/work/main/cpp/src/tensor_view_test.cc:54]==]
    WORKING_DIRECTORY [==[/work/main/build-tests]==]
    SKIP_REGULAR_EXPRESSION [==[\[  SKIPPED \]]==]
    
)
add_test([=[TensorView.NegativeStrides]=]  /work/main/build-tests/pyckpt_core_tests [==[--gtest_filter=TensorView.NegativeStrides]==] --gtest_also_run_disabled_tests)
set_tests_properties([=[TensorView.NegativeStrides]=]
  PROPERTIES
    
    DEF_SOURCE_LINE [==[/work/main/cpp/src/tensor_view_test.cc:65]==]
    WORKING_DIRECTORY [==[/work/main/build-tests]==]
    SKIP_REGULAR_EXPRESSION [==[\[  SKIPPED \]]==]
    
)
add_test([=[TensorView.ValidateRejectsOverflowAndNegative]=]  /work/main/build-tests/pyckpt_core_tests [==[--gtest_filter=TensorView.ValidateRejectsOverflowAndNegative]==] --gtest_also_run_disabled_tests)
set_tests_properties([=[TensorView.ValidateRejectsOverflowAndNegative]=]
  PROPERTIES
    
    DEF_SOURCE_LINE [==[/work/main/cpp/src/tensor_view_test.cc:77]==]
    WORKING_DIRECTORY [==[/work/main/build-tests]==]
    SKIP_REGULAR_EXPRESSION [==[\[  SKIPPED \]]==]
    
)
add_test([=[Layout.BalancedAlignedAndNonOverlapping]=]  /work/main/build-tests/pyckpt_core_tests [==[--gtest_filter=Layout.BalancedAlignedAndNonOverlapping]==] --gtest_also_run_disabled_tests)
set_tests_properties([=[Layout.BalancedAlignedAndNonOverlapping]=]
  PROPERTIES
    
    DEF_SOURCE_LINE [==[/work/main/cpp/src/layout_test.cc:10]==]
    WORKING_DIRECTORY [==[/work/main/build-tests]==]
    SKIP_REGULAR_EXPRESSION [==[\[  SKIPPED \]]==]
    
)
add_test([=[Layout.InputOrderInsideAFile]=]  /work/main/build-tests/pyckpt_core_tests [==[--gtest_filter=Layout.InputOrderInsideAFile]==] --gtest_also_run_disabled_tests)
set_tests_properties([=[Layout.InputOrderInsideAFile]=]
  PROPERTIES
    
    DEF_SOURCE_LINE [==[/work/main/cpp/src/layout_test.cc:29]==]
    WORKING_DIRECTORY [==[/work/main/build-tests]==]
    SKIP_REGULAR_EXPRESSION [==[\[  SKIPPED \]]==]
    
)
add_test([=[Layout.RejectsBadArguments]=]  /work/main/build-tests/pyckpt_core_tests [==[--gtest_filter=Layout.RejectsBadArguments]==] --gtest_also_run_disabled_tests)
set_tests_properties([=[Layout.RejectsBadArguments]=]
  PROPERTIES
    
    DEF_SOURCE_LINE [==[/work/main/cpp/src/layout_test.cc:37]==]
    WORKING_DIRECTORY [==[/work/main/build-tests]==]
    SKIP_REGULAR_EXPRESSION [==[\[  SKIPPED \]]==]
    
)
add_test([=[ShardIo.RoundTrip]=]  /work/main/build-tests/pyckpt_core_tests [==[--gtest_filter=ShardIo.RoundTrip]==] --gtest_also_run_disabled_tests)
set_tests_properties([=[ShardIo.RoundTrip]=]
  PROPERTIES
    
    DEF_SOURCE_LINE [==[/work/main/cpp/src/shard_io_test.cc:102]==]
    WORKING_DIRECTORY [==[/work/main/build-tests]==]
    SKIP_REGULAR_EXPRESSION [==[\[  SKIPPED \]]==]
    
)
add_test([=[ShardIo.ChecksumsMatchComputeChecksums]=]  /work/main/build-tests/pyckpt_core_tests [==[--gtest_filter=ShardIo.ChecksumsMatchComputeChecksums]==] --gtest_also_run_disabled_tests)
set_tests_properties([=[ShardIo.ChecksumsMatchComputeChecksums]=]
  PROPERTIES
    
    DEF_SOURCE_LINE [==[/work/main/cpp/src/shard_io_test.cc:113]==]
    WORKING_DIRECTORY [==[/work/main/build-tests]==]
    SKIP_REGULAR_EXPRESSION [==[\[  SKIPPED \]]==]
    
)
add_test([=[ShardIo.BitFlipIsCorruptionNamingKeyFileAndRange]=]  /work/main/build-tests/pyckpt_core_tests [==[--gtest_filter=ShardIo.BitFlipIsCorruptionNamingKeyFileAndRange]==] --gtest_also_run_disabled_tests)
set_tests_properties([=[ShardIo.BitFlipIsCorruptionNamingKeyFileAndRange]=]
  PROPERTIES
    
    DEF_SOURCE_LINE [==[/work/main/cpp/src/shard_io_test.cc:122]==]
    WORKING_DIRECTORY [==[/work/main/build-tests]==]
    SKIP_REGULAR_EXPRESSION [==[\[  SKIPPED \]]==]
    
)
add_test([=[ShardIo.TruncatedFileFailsBeforeReading]=]  /work/main/build-tests/pyckpt_core_tests [==[--gtest_filter=ShardIo.TruncatedFileFailsBeforeReading]==] --gtest_also_run_disabled_tests)
set_tests_properties([=[ShardIo.TruncatedFileFailsBeforeReading]=]
  PROPERTIES
    
    DEF_SOURCE_LINE [==[/work/main/cpp/src/shard_io_test.cc:135]==]
    WORKING_DIRECTORY [==[/work/main/build-tests]==]
    SKIP_REGULAR_EXPRESSION [==[\[  SKIPPED \]]==]
    
)
add_test([=[ShardIo.MissingFileIsNotFound]=]  /work/main/build-tests/pyckpt_core_tests [==[--gtest_filter=ShardIo.MissingFileIsNotFound]==] --gtest_also_run_disabled_tests)
set_tests_properties([=[ShardIo.MissingFileIsNotFound]=]
  PROPERTIES
    
    DEF_SOURCE_LINE [==[/work/main/cpp/src/shard_io_test.cc:147]==]
    WORKING_DIRECTORY [==[/work/main/build-tests]==]
    SKIP_REGULAR_EXPRESSION [==[\[  SKIPPED \]]==]
    
)
add_test([=[ShardIo.WriterRefusesToOverwrite]=]  /work/main/build-tests/pyckpt_core_tests [==[--gtest_filter=ShardIo.WriterRefusesToOverwrite]==] --gtest_also_run_disabled_tests)
set_tests_properties([=[ShardIo.WriterRefusesToOverwrite]=]
  PROPERTIES
    
    DEF_SOURCE_LINE [==[/work/main/cpp/src/shard_io_test.cc:155]==]
    WORKING_DIRECTORY [==[/work/main/build-tests]==]
    SKIP_REGULAR_EXPRESSION [==[\[  SKIPPED \]]==]
    
)
add_test([=[ShardIoMemory.VerifiesInPlace]=]  /work/main/build-tests/pyckpt_core_tests [==[--gtest_filter=ShardIoMemory.VerifiesInPlace]==] --gtest_also_run_disabled_tests)
set_tests_properties([=[ShardIoMemory.VerifiesInPlace]=]
  PROPERTIES
    
    DEF_SOURCE_LINE [==[/work/main/cpp/src/shard_io_test.cc:163]==]
    WORKING_DIRECTORY [==[/work/main/build-tests]==]
    SKIP_REGULAR_EXPRESSION [==[\[  SKIPPED \]]==]
    
)
add_test([=[StagedWriteTest.WritesTheStagedCopyNotLaterChanges]=]  /work/main/build-tests/pyckpt_core_tests [==[--gtest_filter=StagedWriteTest.WritesTheStagedCopyNotLaterChanges]==] --gtest_also_run_disabled_tests)
set_tests_properties([=[StagedWriteTest.WritesTheStagedCopyNotLaterChanges]=]
  PROPERTIES
    
    DEF_SOURCE_LINE [==[/work/main/cpp/src/shard_io_test.cc:199]==]
    WORKING_DIRECTORY [==[/work/main/build-tests]==]
    SKIP_REGULAR_EXPRESSION [==[\[  SKIPPED \]]==]
    
)
add_test([=[StagedWriteTest.WaitWithoutStageIsAnError]=]  /work/main/build-tests/pyckpt_core_tests [==[--gtest_filter=StagedWriteTest.WaitWithoutStageIsAnError]==] --gtest_also_run_disabled_tests)
set_tests_properties([=[StagedWriteTest.WaitWithoutStageIsAnError]=]
  PROPERTIES
    
    DEF_SOURCE_LINE [==[/work/main/cpp/src/shard_io_test.cc:232]==]
    WORKING_DIRECTORY [==[/work/main/build-tests]==]
    SKIP_REGULAR_EXPRESSION [==[\[  SKIPPED \]]==]
    
)
set(pyckpt_core_tests_TESTS [==[Crc32c.Rfc3720Vectors]==] [==[Crc32c.ExtendEqualsWhole]==] [==[Crc32c.HardwareMatchesPortableOnRandomBuffers]==] [==[Crc32c.CombineMatchesConcatenation]==] [==[Crc32c.MaskRoundTripsAndDiffers]==] [==[Crc32c.ImplementationIsNamed]==] [==[TensorView.Contiguity]==] [==[TensorView.GatherAnyRangeOfATranspose]==] [==[TensorView.ScatterInvertsGather]==] [==[TensorView.NegativeStrides]==] [==[TensorView.ValidateRejectsOverflowAndNegative]==] [==[Layout.BalancedAlignedAndNonOverlapping]==] [==[Layout.InputOrderInsideAFile]==] [==[Layout.RejectsBadArguments]==] [==[ShardIo.RoundTrip]==] [==[ShardIo.ChecksumsMatchComputeChecksums]==] [==[ShardIo.BitFlipIsCorruptionNamingKeyFileAndRange]==] [==[ShardIo.TruncatedFileFailsBeforeReading]==] [==[ShardIo.MissingFileIsNotFound]==] [==[ShardIo.WriterRefusesToOverwrite]==] [==[ShardIoMemory.VerifiesInPlace]==] [==[StagedWriteTest.WritesTheStagedCopyNotLaterChanges]==] [==[StagedWriteTest.WaitWithoutStageIsAnError]==])
