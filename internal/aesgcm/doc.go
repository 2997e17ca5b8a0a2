// Package aesgcm owns the AES-GCM the HBONE record layer seals and opens
// TLS 1.3 records with: on amd64 CPUs with VAES and VPCLMULQDQ on 512-bit
// registers (AVX-512 F, BW and VL) it runs this package's assembly, which
// handles sixteen blocks per instruction sequence; everywhere else, and for
// key sizes other than 16 and 32 bytes, it returns crypto/cipher's GCM.
//
// Why it exists: Go's AES-GCM (crypto/internal/fips140/aes/gcm, Go 1.26 and
// 1.27) uses AES-NI and PCLMULQDQ on 128-bit registers only
// (golang/go#42726), and sealing was a quarter of the sending ztunnel's CPU
// under one bulk stream (bench/README.md). aws-lc, which upstream ztunnel
// uses, has a VAES/AVX-512 AES-GCM too. VAES arrived with Intel's Ice Lake
// and AMD's Zen 4 (Zen 3 has it on 256-bit registers only, so it gets Go's
// code); the older Intel parts whose clock drops most under 512-bit code
// lack VAES and never run this.
//
// The assembly is tested against crypto/cipher over every length up to
// several records, random keys, nonces and additional data, in-place and
// appended output, and tampering (aesgcm_test.go, FuzzAgainstStdlib).
//
// UseAssembly(false) (ZTUNNEL_AES_GCM=go, read by package config) makes New
// return crypto/cipher's GCM on every CPU; so does GODEBUG=cpu.avx512f=off,
// which golang.org/x/sys/cpu honours.
package aesgcm
