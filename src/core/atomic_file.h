// Replacing a file so that a reader (or a crash) sees either the old contents or the new ones,
// never a mix: the bytes go to PATH.tmp, are flushed to disk, then renamed over PATH.
#pragma once
#include <string>
#include <string_view>

#include "core/status.h"

namespace g4 {

Status write_file_atomic(const std::string& path, std::string_view bytes);

}  // namespace g4
