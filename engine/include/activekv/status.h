// Errors as values for expected failures (bad configuration, arena full,
// allocation refused, block not found). Broken contracts throw instead.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

namespace activekv {

enum class ErrorCode {
  kOk = 0,
  kInvalidConfig,
  kUnsupportedLayout,
  kOutOfMemory,
  kOutOfRange,
  kNotFound,
  kStale,
};

class Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return {}; }

  bool ok() const { return code_ == ErrorCode::kOk; }
  ErrorCode error_code() const { return code_; }
  const std::string& error() const { return message_; }

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

template <class T>
class Result {
 public:
  Result(T value) : value_(std::move(value)) {}          // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {}  // NOLINT
  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() { return *value_; }
  const T& value() const { return *value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

// The value, or its error thrown as std::runtime_error: for callers where a
// failure is a broken contract (a step's plan naming a slot it was not given).
template <class T>
T value_or_throw(Result<T> r) {
  if (!r.ok()) throw std::runtime_error(r.status().error());
  return std::move(r.value());
}

}  // namespace activekv
