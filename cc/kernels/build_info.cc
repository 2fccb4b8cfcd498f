// The TensorFlow this library was compiled against, as a string in the library's read-only data.
//
// A custom-op library built against one TensorFlow may load into another and then crash or misbehave (TensorFlow's C++
// ABI is not stable across releases), so tf_fusedrec/ops/_loader.py reads this marker from the file *before* loading
// it and refuses a library built for another TensorFlow, naming both versions (Horovod and TFRA check the same way).
// Read from the file's bytes, not through a symbol: a mismatched library must not be loaded to be checked.
//
// FUSEDREC_TF_VERSION is tf.__version__ of the TensorFlow whose headers the build uses, passed by both builds
// (setup.py, and BUILD from tf_configure's TF_VERSION): TensorFlow 2.21's headers no longer define its version.
#ifndef FUSEDREC_TF_VERSION
#error "FUSEDREC_TF_VERSION (the TensorFlow version built against) must be defined by the build"
#endif

namespace tensorflow {
namespace fusedrec {

// `used` keeps the otherwise unreferenced array in the linked library.
extern const char kFusedRecBuildInfo[] __attribute__((used)) =
    "tf_fusedrec-built-against-tensorflow=" FUSEDREC_TF_VERSION ";";

}  // namespace fusedrec
}  // namespace tensorflow
