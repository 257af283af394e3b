// Tests for DType: sizes, names, and the ONNX / DLPack / numpy mappings.
#include <set>
#include <tuple>

#include "test_support.hpp"

namespace aitune {
namespace {

using test::expect_error;

const std::vector<DType> kAllDTypes = {DType::kBool,    DType::kInt8,     DType::kInt16,   DType::kInt32,
                                       DType::kInt64,   DType::kUInt8,    DType::kFloat16, DType::kBFloat16,
                                       DType::kFloat32, DType::kFloat64};

struct Expected {
  DType dtype;
  const char* name;
  std::size_t size;
  int onnx;
  uint8_t dl_code;
  const char* numpy;  // nullptr: no numpy type
};

// ONNX TensorProto.DataType values; DLPack codes (kDLBool = 6 is DLPack >= 0.8's code,
// which torch's __dlpack__ produces for torch.bool; the installed header may predate it).
const std::vector<Expected> kTable = {
    {DType::kBool, "bool", 1, 9, 6, "|b1"},
    {DType::kInt8, "int8", 1, 3, kDLInt, "|i1"},
    {DType::kInt16, "int16", 2, 5, kDLInt, "<i2"},
    {DType::kInt32, "int32", 4, 6, kDLInt, "<i4"},
    {DType::kInt64, "int64", 8, 7, kDLInt, "<i8"},
    {DType::kUInt8, "uint8", 1, 2, kDLUInt, "|u1"},
    {DType::kFloat16, "float16", 2, 10, kDLFloat, "<f2"},
    {DType::kBFloat16, "bfloat16", 2, 16, kDLBfloat, nullptr},
    {DType::kFloat32, "float32", 4, 1, kDLFloat, "<f4"},
    {DType::kFloat64, "float64", 8, 11, kDLFloat, "<f8"},
};

TEST(DType, TableCoversEveryDType) { ASSERT_EQ(kTable.size(), kAllDTypes.size()); }

TEST(DType, SizeNameOnnxDlpackNumpyMatchTheTable) {
  for (const auto& e : kTable) {
    SCOPED_TRACE(e.name);
    EXPECT_EQ(dtype_size(e.dtype), e.size);
    EXPECT_EQ(dtype_name(e.dtype), e.name);
    EXPECT_EQ(dtype_to_onnx(e.dtype), e.onnx);
    const DLDataType dl = dtype_to_dlpack(e.dtype);
    EXPECT_EQ(dl.code, e.dl_code);
    EXPECT_EQ(dl.bits, e.size * 8);
    EXPECT_EQ(dl.lanes, 1);
    const auto np = dtype_to_numpy(e.dtype);
    if (e.numpy == nullptr) {
      EXPECT_FALSE(np.has_value()) << *np;
    } else {
      ASSERT_TRUE(np.has_value());
      EXPECT_EQ(*np, e.numpy);
    }
  }
}

TEST(DType, EveryDTypeRoundTripsThroughEveryMapping) {
  for (DType d : kAllDTypes) {
    SCOPED_TRACE(std::string(dtype_name(d)));
    EXPECT_EQ(dtype_from_name(dtype_name(d)), d);
    EXPECT_EQ(dtype_from_onnx(dtype_to_onnx(d)), d);
    EXPECT_EQ(dtype_from_dlpack(dtype_to_dlpack(d)), d);
    if (auto np = dtype_to_numpy(d)) {
      EXPECT_EQ(dtype_from_numpy(*np), d);
    } else {
      EXPECT_EQ(d, DType::kBFloat16) << "only bfloat16 lacks a numpy type";
    }
  }
}

TEST(DType, MappingsAreInjective) {
  std::set<std::string> names;
  std::set<int> onnx;
  std::set<std::tuple<int, int>> dl;
  for (DType d : kAllDTypes) {
    names.insert(std::string(dtype_name(d)));
    onnx.insert(dtype_to_onnx(d));
    const DLDataType t = dtype_to_dlpack(d);
    dl.insert({t.code, t.bits});
  }
  EXPECT_EQ(names.size(), kAllDTypes.size());
  EXPECT_EQ(onnx.size(), kAllDTypes.size());
  EXPECT_EQ(dl.size(), kAllDTypes.size()) << "two dtypes share a DLPack code (bool vs uint8?)";
}

TEST(DType, Aliases) {
  EXPECT_EQ(dtype_from_name("half"), DType::kFloat16);
  EXPECT_EQ(dtype_from_name("float"), DType::kFloat32);
  EXPECT_EQ(dtype_from_name("double"), DType::kFloat64);
  EXPECT_EQ(dtype_from_name("long"), DType::kInt64);
  EXPECT_EQ(dtype_from_name("int"), DType::kInt32);
}

TEST(DType, UnknownNameThrowsInvalidArgumentListingValidNames) {
  const std::string msg = expect_error([] { dtype_from_name("float33"); }, ErrorCode::kInvalidArgument,
                                       {"float33", "bool", "int8", "int16", "int32", "int64", "uint8", "float16",
                                        "bfloat16", "float32", "float64"});
  EXPECT_FALSE(msg.empty());
  expect_error([] { dtype_from_name(""); }, ErrorCode::kInvalidArgument, {"float32"});
  // Names are torch's spellings without a prefix; the prefixed one is not a name.
  expect_error([] { dtype_from_name("torch.float32"); }, ErrorCode::kInvalidArgument, {"float32"});
}

TEST(DType, OnnxTypesAituneDoesNotHandle) {
  EXPECT_FALSE(dtype_from_onnx(0).has_value());   // UNDEFINED
  EXPECT_FALSE(dtype_from_onnx(8).has_value());   // STRING
  EXPECT_FALSE(dtype_from_onnx(4).has_value());   // UINT16
  EXPECT_FALSE(dtype_from_onnx(12).has_value());  // UINT32
  EXPECT_FALSE(dtype_from_onnx(13).has_value());  // UINT64
  EXPECT_FALSE(dtype_from_onnx(14).has_value());  // COMPLEX64
  EXPECT_FALSE(dtype_from_onnx(15).has_value());  // COMPLEX128
  EXPECT_FALSE(dtype_from_onnx(17).has_value());  // FLOAT8E4M3FN
  EXPECT_FALSE(dtype_from_onnx(-1).has_value());
  EXPECT_FALSE(dtype_from_onnx(1000).has_value());
}

TEST(DType, DlpackTypesAituneDoesNotHandle) {
  EXPECT_FALSE(dtype_from_dlpack(DLDataType{kDLFloat, 32, 4}).has_value()) << "vectorised (lanes = 4)";
  EXPECT_FALSE(dtype_from_dlpack(DLDataType{kDLFloat, 8, 1}).has_value());
  EXPECT_FALSE(dtype_from_dlpack(DLDataType{kDLUInt, 16, 1}).has_value());
  EXPECT_FALSE(dtype_from_dlpack(DLDataType{kDLUInt, 32, 1}).has_value());
  EXPECT_FALSE(dtype_from_dlpack(DLDataType{kDLInt, 128, 1}).has_value());
  EXPECT_FALSE(dtype_from_dlpack(DLDataType{kDLBfloat, 32, 1}).has_value());
  EXPECT_FALSE(dtype_from_dlpack(DLDataType{5 /* kDLComplex */, 64, 1}).has_value());
}

TEST(DType, NumpyDescriptors) {
  EXPECT_EQ(dtype_from_numpy("<f4"), DType::kFloat32);
  EXPECT_EQ(dtype_from_numpy("<f2"), DType::kFloat16);
  EXPECT_EQ(dtype_from_numpy("<f8"), DType::kFloat64);
  EXPECT_EQ(dtype_from_numpy("|b1"), DType::kBool);
  EXPECT_EQ(dtype_from_numpy("|u1"), DType::kUInt8);
  EXPECT_EQ(dtype_from_numpy("|i1"), DType::kInt8);
  EXPECT_EQ(dtype_from_numpy("<i8"), DType::kInt64);
  // Big-endian data and types numpy has but aitune does not.
  EXPECT_FALSE(dtype_from_numpy(">f4").has_value());
  EXPECT_FALSE(dtype_from_numpy(">i8").has_value());
  EXPECT_FALSE(dtype_from_numpy("<c8").has_value());
  EXPECT_FALSE(dtype_from_numpy("<u4").has_value());
  EXPECT_FALSE(dtype_from_numpy("<U8").has_value());
  EXPECT_FALSE(dtype_from_numpy("").has_value());
  EXPECT_FALSE(dtype_from_numpy("float32").has_value());
}

}  // namespace
}  // namespace aitune
