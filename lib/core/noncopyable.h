// NonCopyable: the base of the classes that own something (a file, a lock, a handle, a thread) a copy would let go
// of twice.
#pragma once

namespace gt {

/// `class TokenShard : NonCopyable` deletes TokenShard's copy constructor and copy assignment (and, as they are
/// declared, the implicit moves too): one place says it instead of two deleted members in every such class.
class NonCopyable {
 public:
  NonCopyable(const NonCopyable&) = delete;
  NonCopyable& operator=(const NonCopyable&) = delete;

 protected:
  NonCopyable() = default;
  ~NonCopyable() = default;
};

}  // namespace gt
