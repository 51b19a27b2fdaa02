// Throwaway certificates for TLS tests, made with the openssl CLI at test
// time: a CA with a server certificate (SAN IP:127.0.0.1, DNS:localhost)
// and a client certificate, plus another CA with a "rogue" client
// certificate. EC P-256 keys, valid two days.
#ifndef MOECACHE_TESTS_RPC_TEST_CERTS_H_
#define MOECACHE_TESTS_RPC_TEST_CERTS_H_

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace moe::testing {

struct TestCerts {
  std::string dir;
  std::string File(const std::string& name) const { return dir + "/" + name; }
  std::string ca() const { return File("ca.pem"); }
  std::string other_ca() const { return File("other_ca.pem"); }
  std::string server_cert() const { return File("server.pem"); }
  std::string server_key() const { return File("server.key"); }
  std::string client_cert() const { return File("client.pem"); }
  std::string client_key() const { return File("client.key"); }
  std::string rogue_cert() const { return File("rogue.pem"); }
  std::string rogue_key() const { return File("rogue.key"); }
};

// Writes the files into `dir` (which must exist); false when openssl fails.
inline bool MakeTestCerts(const std::string& dir, TestCerts* out) {
  const std::string script = dir + "/make_certs.sh";
  std::ofstream(script) << R"(set -e
cd "$1"
ec="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
for ca in ca other_ca; do
  openssl req -x509 $ec -keyout $ca.key -out $ca.pem -days 2 -subj "/CN=moecache test $ca"
done
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' > server.ext
printf 'basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n' > client.ext
sign() {  # name ca ext serial
  openssl req $ec -keyout $1.key -out $1.csr -subj "/CN=moecache test $1"
  openssl x509 -req -in $1.csr -CA $2.pem -CAkey $2.key -set_serial $4 -days 2 -extfile $3.ext -out $1.pem
}
sign server ca server 11
sign client ca client 12
sign rogue other_ca client 13
)";
  const std::string cmd = "/bin/sh " + script + " " + dir + " >" + dir +
                          "/make_certs.log 2>&1";
  if (std::system(cmd.c_str()) != 0) return false;
  out->dir = dir;
  return true;
}

// Writes `token` to `path` with `mode`.
inline void WriteTokenFile(const std::string& path, const std::string& token,
                           mode_t mode = 0600) {
  std::ofstream(path, std::ios::trunc) << token;
  ::chmod(path.c_str(), mode);
}

}  // namespace moe::testing

#endif  // MOECACHE_TESTS_RPC_TEST_CERTS_H_
