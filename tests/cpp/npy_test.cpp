// Tests for load_npy / save_npy: round trips, files numpy wrote, malformed files.
#include "test_support.hpp"

namespace aitune {
namespace {

using test::ErrorExpectation;
using test::expect_error;
using test::ScopedTempDir;

// Fills every byte of `t` with a pattern that depends on `seed`; for bool, 0/1 only.
void fill_bytes(Tensor& t, unsigned seed) {
  auto* p = static_cast<unsigned char*>(t.data());
  for (std::size_t i = 0; i < t.nbytes(); ++i) {
    const unsigned v = (i * 131u + seed * 17u + 7u) & 0xffu;
    p[i] = t.dtype() == DType::kBool ? static_cast<unsigned char>(v & 1u) : static_cast<unsigned char>(v);
  }
  if (t.dtype() == DType::kFloat16 || t.dtype() == DType::kFloat32 || t.dtype() == DType::kFloat64) {
    // Keep floats finite and comparable bytewise: small integers.
    for (std::size_t i = 0; i < t.nbytes() / dtype_size(t.dtype()); ++i) {
      const int v = static_cast<int>((i * 7 + seed) % 23) - 11;
      if (t.dtype() == DType::kFloat32) static_cast<float*>(t.data())[i] = static_cast<float>(v) * 0.25f;
      if (t.dtype() == DType::kFloat64) static_cast<double*>(t.data())[i] = static_cast<double>(v) * 0.125;
      if (t.dtype() == DType::kFloat16) static_cast<uint16_t*>(t.data())[i] = static_cast<uint16_t>(0x3C00 + v);
    }
  }
}

void expect_same_tensor(const Tensor& a, const Tensor& b) {
  ASSERT_TRUE(a.defined());
  ASSERT_TRUE(b.defined());
  EXPECT_EQ(a.dtype(), b.dtype());
  EXPECT_EQ(a.shape(), b.shape());
  EXPECT_EQ(a.device(), Device::cpu());
  ASSERT_EQ(a.nbytes(), b.nbytes());
  EXPECT_TRUE(a.view().is_contiguous());
  if (a.nbytes() > 0) {
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0) << "contents differ";
  }
}

TEST(Npy, RoundTripEveryNumpyDtype) {
  ScopedTempDir dir;
  const std::vector<DType> dtypes = {DType::kBool,  DType::kInt8,    DType::kInt16,   DType::kInt32,
                                     DType::kInt64, DType::kUInt8,   DType::kFloat16, DType::kFloat32,
                                     DType::kFloat64};
  const std::vector<Shape> shapes = {{5}, {2, 3, 4}, {1, 1, 7}, {}};
  unsigned seed = 0;
  for (DType d : dtypes) {
    for (const Shape& shape : shapes) {
      SCOPED_TRACE(std::string(dtype_name(d)) + shape_to_string(shape));
      Tensor t = Tensor::empty_host(d, shape);
      fill_bytes(t, ++seed);
      std::string name = "t";  // (built piecewise: GCC 12 warns falsely on "t" + to_string(...))
      name += std::to_string(seed);
      name += ".npy";
      const std::string path = dir.file(name);
      save_npy(path, t);
      ASSERT_TRUE(std::filesystem::exists(path));
      const std::string bytes = test::read_file_bytes(path);
      ASSERT_GE(bytes.size(), 10u);
      EXPECT_EQ(bytes.substr(0, 6), "\x93NUMPY");
      EXPECT_EQ(bytes[6], '\x01') << "save_npy writes version 1.0";
      EXPECT_EQ(bytes[7], '\x00');
      EXPECT_EQ((bytes.size() - t.nbytes()) % 64, 0u) << "header must pad the data to 64 bytes";
      EXPECT_NE(bytes.find(*dtype_to_numpy(d)), std::string::npos) << "descr missing from header";
      expect_same_tensor(load_npy(path), t);
    }
  }
}

TEST(Npy, RoundTripEmptyArray) {
  ScopedTempDir dir;
  Tensor t = Tensor::empty_host(DType::kFloat32, {0, 3});
  save_npy(dir.file("empty.npy"), t);
  Tensor back = load_npy(dir.file("empty.npy"));
  EXPECT_EQ(back.shape(), (Shape{0, 3}));
  EXPECT_EQ(back.dtype(), DType::kFloat32);
  EXPECT_EQ(back.nbytes(), 0u);
}

TEST(Npy, SaveOverwritesExistingFile) {
  ScopedTempDir dir;
  const std::string path = dir.file("over.npy");
  save_npy(path, test::make_host<int64_t>(DType::kInt64, {4}, {1, 2, 3, 4}));
  save_npy(path, test::make_host<int32_t>(DType::kInt32, {2}, {9, 8}));
  Tensor back = load_npy(path);
  EXPECT_EQ(back.dtype(), DType::kInt32);
  EXPECT_EQ(test::values_of<int32_t>(back), (std::vector<int32_t>{9, 8}));
}

TEST(Npy, LoadMlpSampleWrittenByNumpy) {
  Tensor x = test::load_fixture_npy("mlp_x.npy");
  ASSERT_TRUE(x.defined());
  EXPECT_EQ(x.dtype(), DType::kFloat32);
  EXPECT_EQ(x.shape(), (Shape{3, 64}));
  EXPECT_EQ(x.device(), Device::cpu());
  EXPECT_EQ(x.nbytes(), 3u * 64u * 4u);
  // The data are the file's last bytes.
  const std::string bytes = test::read_file_bytes(test::fixture("mlp_x.npy"));
  ASSERT_GE(bytes.size(), x.nbytes());
  EXPECT_EQ(std::memcmp(x.data(), bytes.data() + bytes.size() - x.nbytes(), x.nbytes()), 0);
  const auto v = test::values_of<float>(x);
  EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](float f) { return std::isfinite(f); }));
}

TEST(Npy, LoadKnownContents) {
  {
    Tensor t = test::load_fixture_npy("npy_arange_f32.npy");
    EXPECT_EQ(t.dtype(), DType::kFloat32);
    EXPECT_EQ(t.shape(), (Shape{3, 4}));
    EXPECT_EQ(test::values_of<float>(t), (std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}));
  }
  {
    Tensor t = test::load_fixture_npy("npy_v2_i16.npy");  // format 2.0
    EXPECT_EQ(t.dtype(), DType::kInt16);
    EXPECT_EQ(t.shape(), (Shape{2, 5}));
    EXPECT_EQ(test::values_of<int16_t>(t), (std::vector<int16_t>{-5, -4, -3, -2, -1, 0, 1, 2, 3, 4}));
  }
  {
    Tensor t = test::load_fixture_npy("npy_v3_u8.npy");  // format 3.0
    EXPECT_EQ(t.dtype(), DType::kUInt8);
    EXPECT_EQ(t.shape(), (Shape{4}));
    EXPECT_EQ(test::values_of<uint8_t>(t), (std::vector<uint8_t>{250, 251, 252, 253}));
  }
  {
    Tensor t = test::load_fixture_npy("npy_scalar_f64.npy");
    EXPECT_EQ(t.dtype(), DType::kFloat64);
    EXPECT_TRUE(t.shape().empty()) << shape_to_string(t.shape());
    EXPECT_EQ(test::values_of<double>(t), (std::vector<double>{3.5}));
  }
  {
    Tensor t = test::load_fixture_npy("npy_bool.npy");
    EXPECT_EQ(t.dtype(), DType::kBool);
    EXPECT_EQ(t.shape(), (Shape{2, 3}));
    EXPECT_EQ(test::values_of<uint8_t>(t), (std::vector<uint8_t>{1, 0, 1, 0, 0, 1}));
  }
}

TEST(Npy, RejectsFortranOrderBigEndianAndUnsupportedDtypes) {
  for (const char* name : {"npy_fortran.npy", "npy_big_endian.npy", "npy_complex.npy"}) {
    SCOPED_TRACE(name);
    const std::string path = test::fixture(name);
    const std::string msg = expect_error([&] { load_npy(path); }, ErrorCode::kInvalidArgument);
    EXPECT_NE(msg.find(path), std::string::npos) << "message must name the file: " << msg;
  }
}

TEST(Npy, MissingFileThrowsIo) {
  ScopedTempDir dir;
  const std::string path = dir.file("does_not_exist.npy");
  const std::string msg = expect_error([&] { load_npy(path); }, ErrorCode::kIo);
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
}

TEST(Npy, ADirectoryIsAFileThatCannotBeReadNotBadMagic) {
  // `--input x=SOMEDIR` said "bad magic: not a .npy file" (exit 2) of a path naming no file.
  ScopedTempDir dir;
  std::filesystem::create_directory(dir.file("x.npy"));
  expect_error([&] { load_npy(dir.file("x.npy")); }, ErrorCode::kIo, {"is a directory"});
}

TEST(Npy, BadMagicThrowsInvalidArgument) {
  ScopedTempDir dir;
  const std::string good = dir.file("good.npy");
  save_npy(good, test::make_host<float>(DType::kFloat32, {2}, {1.0f, 2.0f}));
  std::string bytes = test::read_file_bytes(good);
  bytes[1] = 'X';  // "\x93XUMPY"
  const std::string bad = dir.file("bad_magic.npy");
  test::write_file_bytes(bad, bytes);
  const std::string msg = expect_error([&] { load_npy(bad); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find(bad), std::string::npos) << msg;

  const std::string text = dir.file("text.npy");
  test::write_file_bytes(text, "this is not a numpy file at all, just some text\n");
  expect_error([&] { load_npy(text); }, ErrorCode::kInvalidArgument);

  // an .npz (a zip of .npy files) is said as one, not as "bad magic" (a session-31 probe)
  const std::string npz = dir.file("inputs.npz");
  test::write_file_bytes(npz, std::string("PK\x03\x04", 4) + std::string(60, '\0'));
  const std::string zipped = expect_error([&] { load_npy(npz); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(zipped.find("zip archive (an .npz of np.savez?)"), std::string::npos) << zipped;

  std::string bad_version = test::read_file_bytes(good);
  bad_version[6] = '\x09';
  test::write_file_bytes(dir.file("bad_version.npy"), bad_version);
  expect_error([&] { load_npy(dir.file("bad_version.npy")); }, ErrorCode::kInvalidArgument);
}

TEST(Npy, MalformedHeaderThrowsInvalidArgument) {
  ScopedTempDir dir;
  auto write_v1 = [&](const std::string& name, std::string header, std::string_view data) {
    while ((10 + header.size() + 1) % 64 != 0) header += ' ';
    header += '\n';
    std::string bytes = "\x93NUMPY\x01";
    bytes += '\0';
    bytes += static_cast<char>(header.size() & 0xff);
    bytes += static_cast<char>(header.size() >> 8);
    bytes += header;
    bytes += data;
    test::write_file_bytes(dir.file(name), bytes);
    return dir.file(name);
  };
  const std::string eight(8, '\0');
  // Sanity: a well-formed hand-written header loads.
  Tensor ok = load_npy(write_v1("ok.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", eight));
  EXPECT_EQ(ok.shape(), (Shape{2}));
  for (const auto& [name, header] : std::vector<std::pair<std::string, std::string>>{
           {"no_descr.npy", "{'fortran_order': False, 'shape': (2,), }"},
           {"no_shape.npy", "{'descr': '<f4', 'fortran_order': False, }"},
           {"bad_shape.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (two,), }"},
           {"not_dict.npy", "garbage garbage garbage"},
       }) {
    SCOPED_TRACE(name);
    expect_error([&, n = name, h = header] { load_npy(write_v1(n, h, eight)); }, ErrorCode::kInvalidArgument);
  }
}

TEST(Npy, TruncatedFileThrows) {
  ScopedTempDir dir;
  const std::string good = dir.file("good.npy");
  Tensor t = Tensor::empty_host(DType::kFloat64, {16});
  fill_bytes(t, 3);
  save_npy(good, t);
  const std::string bytes = test::read_file_bytes(good);
  // Data cut short, header cut short, only the magic.
  for (std::size_t keep : {bytes.size() - 1, bytes.size() - 64, std::size_t{40}, std::size_t{6}, std::size_t{0}}) {
    SCOPED_TRACE("keeping " + std::to_string(keep) + " of " + std::to_string(bytes.size()) + " bytes");
    const std::string path = dir.file("cut" + std::to_string(keep) + ".npy");
    test::write_file_bytes(path, std::string_view(bytes).substr(0, keep));
    // A short read is an I/O failure or a malformed file; either names the file.
    const std::string msg =
        expect_error([&] { load_npy(path); }, ErrorExpectation{{ErrorCode::kInvalidArgument, ErrorCode::kIo}});
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
  }
}

TEST(Npy, SaveRejectsBFloat16AndDeviceTensors) {
  ScopedTempDir dir;
  expect_error([&] { save_npy(dir.file("bf16.npy"), Tensor::empty_host(DType::kBFloat16, {2})); },
               ErrorCode::kInvalidArgument, {"bfloat16"});
  EXPECT_FALSE(std::filesystem::exists(dir.file("bf16.npy"))) << "nothing written on error";

  // A tensor claiming to live on a CUDA device; save_npy must refuse before reading it.
  auto storage = std::make_shared<std::vector<float>>(4);
  TensorView v;
  v.data = storage->data();
  v.dtype = DType::kFloat32;
  v.shape = {4};
  v.device = Device::cuda(0);
  Tensor on_device = Tensor::adopt(v, storage);
  expect_error([&] { save_npy(dir.file("dev.npy"), on_device); }, ErrorCode::kInvalidArgument);
}

TEST(Npy, SaveIntoMissingDirectoryThrowsIo) {
  ScopedTempDir dir;
  const std::string path = dir.file("no/such/dir/t.npy");
  const std::string msg =
      expect_error([&] { save_npy(path, Tensor::empty_host(DType::kFloat32, {2})); }, ErrorCode::kIo);
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
}

// Regressions of issue 17: headers that crashed std::regex, allocated what they
// claimed, or were read differently from numpy. Each must be a clean kInvalidArgument.
class NpyHostileHeader : public ::testing::Test {
 protected:
  // A version-1 file with `header` verbatim (padded) and `data` after it.
  std::string write(const std::string& name, std::string header, std::string_view data = std::string_view("\0\0\0\0\0\0\0\0", 8)) {
    while ((10 + header.size() + 1) % 64 != 0) header += ' ';
    header += '\n';
    if (header.size() > 0xffff) header.resize(0xffff);
    std::string bytes = "\x93NUMPY\x01";
    bytes += '\0';
    bytes += static_cast<char>(header.size() & 0xff);
    bytes += static_cast<char>(header.size() >> 8);
    bytes += header;
    bytes += data;
    test::write_file_bytes(dir_.file(name), bytes);
    return dir_.file(name);
  }
  std::string refused(const std::string& path, std::vector<std::string> substrings = {}) {
    return expect_error([&] { load_npy(path); }, ErrorExpectation{{ErrorCode::kInvalidArgument}, {}, std::move(substrings)});
  }
  ScopedTempDir dir_;
};

TEST_F(NpyHostileHeader, SpacesInsideTheShapeTuple) {
  // 30,000 spaces crashed std::regex (exit 139); numpy's limit is 10,000 header bytes.
  refused(write("spaces.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::string(30000, ' ') + "2,), }"),
          {"10000"});
  // Within the limit, spaces are fine, as for numpy.
  EXPECT_EQ(load_npy(write("some.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::string(5000, ' ') +
                                            "2,), }"))
                .shape(),
            (Shape{2}));
}

TEST_F(NpyHostileHeader, LongDescrAndManyDimensions) {
  refused(write("descr.npy", "{'descr': '" + std::string(60000, 'f') + "', 'fortran_order': False, 'shape': (2,), }"));
  std::string dims;
  for (int i = 0; i < 20000; ++i) dims += "1,";
  refused(write("dims.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }"));
  dims.clear();
  for (int i = 0; i < 65; ++i) dims += "1,";
  refused(write("dims65.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }"), {"64"});
}

TEST_F(NpyHostileHeader, DeclaredHeaderLongerThanTheFileIsRefusedBeforeAllocating) {
  // 12 bytes declaring a 0xFFFFFFFF-byte (v2) header: allocated 4.2 GB before.
  std::string bytes = "\x93NUMPY\x02";
  bytes += '\0';
  bytes += "\xff\xff\xff\xff";
  test::write_file_bytes(dir_.file("huge.npy"), bytes);
  refused(dir_.file("huge.npy"), {"truncated header", "4294967295"});
}

TEST_F(NpyHostileHeader, ExactlyNumpysKeys) {
  // An extra key whose text holds "'shape': (1, 16)" was read as that shape; numpy refuses the file.
  refused(write("extra.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': \"'shape': (1, 16)\"}"),
          {"'x'"});
  refused(write("twice.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'shape': (2,)}"), {"twice"});
  refused(write("missing.npy", "{'descr': '<f4', 'shape': (2,)}"), {"fortran_order"});
  refused(write("int.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2)}"));
  refused(write("neg.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (-2,)}"));
  refused(write("after.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} junk"));
  refused(write("big.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999999,)}"), {"64 bits"});
  // Shapes whose byte count overflows, even with a zero extent (int64 element counts).
  refused(write("overflow.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296, 0)}"));
  refused(write("overflow2.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296)}"));
  // What numpy also accepts: double quotes, no trailing comma, any key order, a 0-d shape.
  EXPECT_EQ(load_npy(write("dq.npy", "{\"shape\": (1, 2), \"fortran_order\": False, \"descr\": \"<f4\"}")).shape(),
            (Shape{1, 2}));
  EXPECT_EQ(load_npy(write("zero.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': ()}")).shape(), Shape{});
  EXPECT_EQ(load_npy(write("empty.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 7)}", "")).shape(),
            (Shape{0, 7}));
}

}  // namespace
}  // namespace aitune
