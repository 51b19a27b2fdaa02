#include "services/moe_worker/cache_watch.h"

#include <grpc/grpc.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/threads.h"
#include "services/rpc/rpc_util.h"

namespace moe::worker {
namespace {

constexpr absl::Duration kFirstBackoff = absl::Milliseconds(100);
constexpr absl::Duration kMaxBackoff = absl::Seconds(1);
constexpr absl::Duration kWaitLogEvery = absl::Seconds(10);

bool Retryable(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ExpertProvider>> WaitForCache(
    const std::string& address, absl::Duration wait,
    const std::function<absl::StatusOr<std::unique_ptr<ExpertProvider>>()>& attach) {
  const absl::Time start = absl::Now();
  const absl::Time end = start + wait;
  absl::Duration backoff = kFirstBackoff;
  absl::Time next_log = start;
  while (true) {
    absl::StatusOr<std::unique_ptr<ExpertProvider>> p = attach();
    if (p.ok() || !Retryable(p.status())) return p;
    const absl::Time now = absl::Now();
    if (now + backoff > end) {
      if (wait <= absl::ZeroDuration()) return p;
      return absl::Status(p.status().code(),
                          absl::StrCat(p.status().message(), " (gave up after --cache-wait ",
                                       absl::ToInt64Seconds(wait),
                                       " s: start moe-cached first, e.g. systemctl start "
                                       "moe-cached, or allow it longer with --cache-wait)"));
    }
    if (now >= next_log) {
      MOE_LOG(INFO) << "waiting for moe-cached at " << address << " ("
                    << absl::ToInt64Seconds(absl::Ceil(end - now, absl::Seconds(1)))
                    << " s left of --cache-wait; is it started?): "
                    << p.status().message();
      rpc::NotifyStatus(absl::StrCat("waiting for moe-cached at ", address));
      next_log = now + kWaitLogEvery;
    }
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
}

absl::StatusOr<std::unique_ptr<CacheWatch>> CacheWatch::Start(
    const std::string& address, const rpc::ClientSecurity& security,
    std::function<void(bool serving)> on_change) {
  ASSIGN_OR_RETURN(rpc::ListenAddress parsed, rpc::ParseListenAddress(address));
  ASSIGN_OR_RETURN(rpc::ClientCredentials creds,
                   rpc::LoadClientCredentials(security, parsed.is_unix));
  grpc::ChannelArguments args;
  // Notice a restarted daemon within about a second, not after gRPC's default
  // reconnect backoff (which grows to two minutes).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(kMaxBackoff)));
  std::unique_ptr<CacheWatch> w(new CacheWatch());
  w->address_ = address;
  w->on_change_ = std::move(on_change);
  w->stub_ = grpc::health::v1::Health::NewStub(
      grpc::CreateCustomChannel(parsed.Uri(), creds.credentials, args));
  CacheWatch* raw = w.get();
  w->thread_ = std::thread([raw] { raw->Run(); });
  return w;
}

CacheWatch::~CacheWatch() { Stop(); }

void CacheWatch::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (call_ != nullptr) call_->TryCancel();
  }
  if (thread_.joinable()) thread_.join();
}

void CacheWatch::Report(bool serving, const std::string& why) {
  if (serving == serving_) return;
  serving_ = serving;
  if (serving) {
    MOE_LOG(INFO) << "moe-cached at " << address_ << " serves again: health SERVING";
  } else {
    MOE_LOG(WARNING) << "moe-cached at " << address_ << " is down (" << why
                     << "): health NOT_SERVING until it is back";
  }
  on_change_(serving);
}

std::string CacheWatch::WatchOnce() {
  grpc::ClientContext ctx;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return "stopping";
    call_ = &ctx;
  }
  grpc::health::v1::HealthCheckRequest request;  // service "": the whole server
  std::unique_ptr<grpc::ClientReader<grpc::health::v1::HealthCheckResponse>> reader =
      stub_->Watch(&ctx, request);
  grpc::health::v1::HealthCheckResponse response;
  while (reader->Read(&response)) {
    const bool up = response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
    Report(up, "it answers NOT_SERVING");
  }
  const grpc::Status status = reader->Finish();
  absl::MutexLock lock(&mu_);
  call_ = nullptr;
  return status.ok() ? "health stream ended" : status.error_message();
}

void CacheWatch::Run() {
  NameThisThread("moe-cachewatch");
  absl::Duration backoff = kFirstBackoff;
  while (true) {
    const absl::Time started = absl::Now();
    const std::string why = WatchOnce();
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    Report(false, why);
    // A stream that lasted (the daemon was up) starts the backoff afresh.
    if (absl::Now() - started > kMaxBackoff) backoff = kFirstBackoff;
    absl::MutexLock lock(&mu_);
    if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), backoff)) return;
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
}

}  // namespace moe::worker
