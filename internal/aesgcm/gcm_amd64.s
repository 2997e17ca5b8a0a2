// AES-GCM with VAES and VPCLMULQDQ on 512-bit registers: the counter-mode
// pass encrypts sixteen blocks per iteration, and GHASH multiplies sixteen
// blocks per iteration by H^16..H^1 with one reduction. Sealing runs the two
// passes one after the other (the record is in L1 by then), not stitched.
//
// Field elements are kept as 128-bit little-endian integers holding the
// GCM block byte-reversed (VPSHUFB with bswapMask), which bit-reflects the
// polynomial: bit 127-k is the coefficient of x^k. A carry-less product of
// two such values is the 255-bit product shifted right by one; the table
// holds H·x^-1 instead of H so that shift cancels, and the 256-bit result is
// folded back by two multiplications by the reflected polynomial's top half
// (0xc2 << 56), the method in Gueron and Kounavis's Intel white paper
// "Intel Carry-Less Multiplication Instruction and its Usage for Computing
// the GCM Mode".

#include "textflag.h"

// VPSHUFB control that reverses the bytes of each 128-bit lane.
DATA bswapMask<>+0x00(SB)/8, $0x08090a0b0c0d0e0f
DATA bswapMask<>+0x08(SB)/8, $0x0001020304050607
DATA bswapMask<>+0x10(SB)/8, $0x08090a0b0c0d0e0f
DATA bswapMask<>+0x18(SB)/8, $0x0001020304050607
DATA bswapMask<>+0x20(SB)/8, $0x08090a0b0c0d0e0f
DATA bswapMask<>+0x28(SB)/8, $0x0001020304050607
DATA bswapMask<>+0x30(SB)/8, $0x08090a0b0c0d0e0f
DATA bswapMask<>+0x38(SB)/8, $0x0001020304050607
GLOBL bswapMask<>(SB), RODATA|NOPTR, $64

// Added to a counter block broadcast to four lanes (byte-reversed, so the
// 32-bit big-endian counter is each lane's lowest dword): lanes c..c+3.
DATA ctrLanes<>+0x00(SB)/8, $0
DATA ctrLanes<>+0x08(SB)/8, $0
DATA ctrLanes<>+0x10(SB)/8, $1
DATA ctrLanes<>+0x18(SB)/8, $0
DATA ctrLanes<>+0x20(SB)/8, $2
DATA ctrLanes<>+0x28(SB)/8, $0
DATA ctrLanes<>+0x30(SB)/8, $3
DATA ctrLanes<>+0x38(SB)/8, $0
GLOBL ctrLanes<>(SB), RODATA|NOPTR, $64

// Four added to every lane's counter. VPADDD wraps the 32-bit counter on
// its own, as GCM's inc32 does.
DATA ctrFour<>+0x00(SB)/8, $4
DATA ctrFour<>+0x08(SB)/8, $0
DATA ctrFour<>+0x10(SB)/8, $4
DATA ctrFour<>+0x18(SB)/8, $0
DATA ctrFour<>+0x20(SB)/8, $4
DATA ctrFour<>+0x28(SB)/8, $0
DATA ctrFour<>+0x30(SB)/8, $4
DATA ctrFour<>+0x38(SB)/8, $0
GLOBL ctrFour<>(SB), RODATA|NOPTR, $64

DATA ctrOne<>+0x00(SB)/8, $1
DATA ctrOne<>+0x08(SB)/8, $0
GLOBL ctrOne<>(SB), RODATA|NOPTR, $16

// x^128 + x^7 + x^2 + x + 1 reflected, without the x^128 term; only the
// high quadword (0xc2 << 56) is used by the reduction.
DATA gcmPoly<>+0x00(SB)/8, $0x0000000000000001
DATA gcmPoly<>+0x08(SB)/8, $0xc200000000000000
GLOBL gcmPoly<>(SB), RODATA|NOPTR, $16

// One AES-128 key schedule step: k is the previous round key, t holds
// AESKEYGENASSIST's output; s is scratch. dword selects which word of t
// carries the substituted word (0xff for the rcon step, 0xaa for the extra
// AES-256 step).
#define KEYSTEP(dword, k, t, s) \
	PSHUFD $dword, t, t; \
	MOVOU  k, s; \
	PSLLO  $4, s; \
	PXOR   s, k; \
	PSLLO  $4, s; \
	PXOR   s, k; \
	PSLLO  $4, s; \
	PXOR   s, k; \
	PXOR   t, k

// One AES-128 round key from the previous one (X0), stored at off(DI).
#define KEY128(rcon, off) \
	AESKEYGENASSIST $rcon, X0, X1; \
	KEYSTEP(0xff, X0, X1, X2); \
	MOVOU X0, off(DI)

// func expandKey128(key *byte, rk *[240]byte)
TEXT ·expandKey128(SB), NOSPLIT, $0-16
	MOVQ  key+0(FP), AX
	MOVQ  rk+8(FP), DI
	MOVOU (AX), X0
	MOVOU X0, 0(DI)
	KEY128(0x01, 16)
	KEY128(0x02, 32)
	KEY128(0x04, 48)
	KEY128(0x08, 64)
	KEY128(0x10, 80)
	KEY128(0x20, 96)
	KEY128(0x40, 112)
	KEY128(0x80, 128)
	KEY128(0x1b, 144)
	KEY128(0x36, 160)
	RET

// Two AES-256 schedule steps: a new even round key from the odd one's
// rotated and substituted last word and rcon, then a new odd round key
// from the even one's substituted last word.
#define KEYSTEP256(rcon, off) \
	AESKEYGENASSIST $rcon, X3, X1; \
	KEYSTEP(0xff, X0, X1, X2); \
	MOVOU X0, off(DI); \
	AESKEYGENASSIST $0x00, X0, X1; \
	KEYSTEP(0xaa, X3, X1, X2); \
	MOVOU X3, off+16(DI)

// func expandKey256(key *byte, rk *[240]byte)
TEXT ·expandKey256(SB), NOSPLIT, $0-16
	MOVQ key+0(FP), AX
	MOVQ rk+8(FP), DI
	MOVOU 0(AX), X0
	MOVOU 16(AX), X3
	MOVOU X0, 0(DI)
	MOVOU X3, 16(DI)
	KEYSTEP256(0x01, 32)
	KEYSTEP256(0x02, 64)
	KEYSTEP256(0x04, 96)
	KEYSTEP256(0x08, 128)
	KEYSTEP256(0x10, 160)
	KEYSTEP256(0x20, 192)
	AESKEYGENASSIST $0x40, X3, X1
	KEYSTEP(0xff, X0, X1, X2)
	MOVOU X0, 224(DI)
	RET

// func encryptBlock(rk *[240]byte, rounds int, dst, src *[16]byte)
TEXT ·encryptBlock(SB), NOSPLIT, $0-32
	MOVQ rk+0(FP), AX
	MOVQ rounds+8(FP), R8
	MOVQ dst+16(FP), DI
	MOVQ src+24(FP), SI
	VMOVDQU (SI), X0
	VPXOR   0(AX), X0, X0
	VAESENC 16(AX), X0, X0
	VAESENC 32(AX), X0, X0
	VAESENC 48(AX), X0, X0
	VAESENC 64(AX), X0, X0
	VAESENC 80(AX), X0, X0
	VAESENC 96(AX), X0, X0
	VAESENC 112(AX), X0, X0
	VAESENC 128(AX), X0, X0
	VAESENC 144(AX), X0, X0
	CMPQ    R8, $14
	JNE     last128
	VAESENC 160(AX), X0, X0
	VAESENC 176(AX), X0, X0
	VAESENC 192(AX), X0, X0
	VAESENC 208(AX), X0, X0
	VAESENCLAST 224(AX), X0, X0
	JMP     done
last128:
	VAESENCLAST 160(AX), X0, X0
done:
	VMOVDQU X0, (DI)
	VZEROUPPER
	RET

// Folds the 256-bit product hi:lo into lo (see the top of the file).
#define REDUCE(lo, hi, t) \
	VPCLMULQDQ $0x10, gcmPoly<>(SB), lo, t; \
	VPSHUFD    $0x4e, lo, lo; \
	VPXOR      t, lo, lo; \
	VPCLMULQDQ $0x10, gcmPoly<>(SB), lo, t; \
	VPSHUFD    $0x4e, lo, lo; \
	VPXOR      t, lo, lo; \
	VPXOR      hi, lo, lo

// lo:hi = a·h unreduced, mid scratch; registers below X16 (VEX forms).
#define MUL1(a, h, lo, mid, hi, t) \
	VPCLMULQDQ $0x00, h, a, lo; \
	VPCLMULQDQ $0x11, h, a, hi; \
	VPCLMULQDQ $0x01, h, a, mid; \
	VPCLMULQDQ $0x10, h, a, t; \
	VPXOR      t, mid, mid; \
	VPSLLDQ    $8, mid, t; \
	VPSRLDQ    $8, mid, mid; \
	VPXOR      t, lo, lo; \
	VPXOR      mid, hi, hi

// func gfmul(a, b *[16]byte)
TEXT ·gfmul(SB), NOSPLIT, $0-16
	MOVQ a+0(FP), AX
	MOVQ b+8(FP), BX
	VMOVDQU (AX), X0
	VMOVDQU (BX), X1
	MUL1(X0, X1, X2, X3, X4, X5)
	REDUCE(X2, X4, X5)
	VMOVDQU X2, (AX)
	VZEROUPPER
	RET

// Four lanes of d times the four lanes of h, unreduced, into lo, mid, hi;
// t is scratch.
#define MUL4(d, h, lo, mid, hi, t) \
	VPCLMULQDQ $0x00, h, d, lo; \
	VPCLMULQDQ $0x11, h, d, hi; \
	VPCLMULQDQ $0x01, h, d, mid; \
	VPCLMULQDQ $0x10, h, d, t; \
	VPXORQ     t, mid, mid

// Four lanes of d times the four lanes of h, added to the unreduced lane
// sums lo, mid, hi; t0 and t1 are scratch.
#define MUL4ADD(d, h, lo, mid, hi, t0, t1) \
	VPCLMULQDQ $0x00, h, d, t0; \
	VPXORQ     t0, lo, lo; \
	VPCLMULQDQ $0x11, h, d, t0; \
	VPXORQ     t0, hi, hi; \
	VPCLMULQDQ $0x01, h, d, t0; \
	VPCLMULQDQ $0x10, h, d, t1; \
	VPTERNLOGD $0x96, t0, t1, mid

// Adds the lane sums in mid into lo and hi, then sums the four lanes of
// each into their low 128 bits (Z12, Z13 scratch). Each register is named
// in every width it is used in.
#define FOLD4(zlo, ylo, xlo, mid, zhi, yhi, xhi) \
	VPSLLDQ       $8, mid, Z12; \
	VPSRLDQ       $8, mid, mid; \
	VPXORQ        Z12, zlo, zlo; \
	VPXORQ        mid, zhi, zhi; \
	VEXTRACTI64X4 $1, zlo, Y12; \
	VPXORQ        Y12, ylo, ylo; \
	VEXTRACTI64X4 $1, zhi, Y13; \
	VPXORQ        Y13, yhi, yhi; \
	VEXTRACTI32X4 $1, ylo, X12; \
	VPXORQ        X12, xlo, xlo; \
	VEXTRACTI32X4 $1, yhi, X13; \
	VPXORQ        X13, xhi, xhi

// The accumulator X0 becomes the reduced sum of the lane products in
// Z5 (lo), Z6 (mid), Z7 (hi).
#define SUM4INTOACC \
	FOLD4(Z5, Y5, X5, Z6, Z7, Y7, X7); \
	REDUCE(X5, X7, X8); \
	VMOVDQA X5, X0

// func ghashBlocks(htab *[256]byte, acc *[16]byte, p *byte, n int)
// n is a multiple of 16. htab holds H·x^-1 to the powers 16 down to 1.
TEXT ·ghashBlocks(SB), NOSPLIT, $0-32
	MOVQ htab+0(FP), AX
	MOVQ acc+8(FP), BX
	MOVQ p+16(FP), SI
	MOVQ n+24(FP), CX
	VMOVDQU64 bswapMask<>(SB), Z31
	VMOVDQU   (BX), X0
	CMPQ      CX, $256
	JB        ghash4
	VMOVDQU64 0(AX), Z20
	VMOVDQU64 64(AX), Z21
	VMOVDQU64 128(AX), Z22
	VMOVDQU64 192(AX), Z23

loop16:
	VMOVDQU64 0(SI), Z1
	VMOVDQU64 64(SI), Z2
	VMOVDQU64 128(SI), Z3
	VMOVDQU64 192(SI), Z4
	VPSHUFB   Z31, Z1, Z1
	VPSHUFB   Z31, Z2, Z2
	VPSHUFB   Z31, Z3, Z3
	VPSHUFB   Z31, Z4, Z4
	VPXORQ    Z0, Z1, Z1
	MUL4(Z1, Z20, Z5, Z6, Z7, Z8)
	MUL4ADD(Z2, Z21, Z5, Z6, Z7, Z8, Z9)
	MUL4ADD(Z3, Z22, Z5, Z6, Z7, Z8, Z9)
	MUL4ADD(Z4, Z23, Z5, Z6, Z7, Z8, Z9)
	SUM4INTOACC
	ADDQ       $256, SI
	SUBQ       $256, CX
	CMPQ       CX, $256
	JAE        loop16

ghash4:
	CMPQ      CX, $64
	JB        ghash1
	VMOVDQU64 192(AX), Z23

loop4:
	VMOVDQU64  0(SI), Z1
	VPSHUFB    Z31, Z1, Z1
	VPXORQ     Z0, Z1, Z1
	MUL4(Z1, Z23, Z5, Z6, Z7, Z8)
	SUM4INTOACC
	ADDQ       $64, SI
	SUBQ       $64, CX
	CMPQ       CX, $64
	JAE        loop4

ghash1:
	TESTQ   CX, CX
	JZ      ghashdone
	VMOVDQU 240(AX), X9
	VMOVDQU bswapMask<>(SB), X10

loop1:
	VMOVDQU (SI), X1
	VPSHUFB X10, X1, X1
	VPXOR   X0, X1, X1
	MUL1(X1, X9, X5, X6, X7, X8)
	REDUCE(X5, X7, X8)
	VMOVDQA X5, X0
	ADDQ    $16, SI
	SUBQ    $16, CX
	JNZ     loop1

ghashdone:
	VMOVDQU X0, (BX)
	VZEROUPPER
	RET

// One AES round on four registers.
#define ROUND4(k, a, b, c, d) \
	VAESENC k, a, a; \
	VAESENC k, b, b; \
	VAESENC k, c, c; \
	VAESENC k, d, d

// func ctrBlocks(rk *[240]byte, rounds int, ctr *[16]byte, dst, src *byte, n int)
// n is a multiple of 16; ctr is the next counter block and is advanced.
TEXT ·ctrBlocks(SB), NOSPLIT, $0-48
	MOVQ rk+0(FP), AX
	MOVQ rounds+8(FP), R8
	MOVQ ctr+16(FP), BX
	MOVQ dst+24(FP), DI
	MOVQ src+32(FP), SI
	MOVQ n+40(FP), CX
	VMOVDQU64       bswapMask<>(SB), Z31
	VBROADCASTI32X4 0(AX), Z16
	VBROADCASTI32X4 16(AX), Z17
	VBROADCASTI32X4 32(AX), Z18
	VBROADCASTI32X4 48(AX), Z19
	VBROADCASTI32X4 64(AX), Z20
	VBROADCASTI32X4 80(AX), Z21
	VBROADCASTI32X4 96(AX), Z22
	VBROADCASTI32X4 112(AX), Z23
	VBROADCASTI32X4 128(AX), Z24
	VBROADCASTI32X4 144(AX), Z25
	CMPQ            R8, $14
	JNE             keys128
	VBROADCASTI32X4 160(AX), Z26
	VBROADCASTI32X4 176(AX), Z27
	VBROADCASTI32X4 192(AX), Z28
	VBROADCASTI32X4 208(AX), Z29
	VBROADCASTI32X4 224(AX), Z30
	JMP             keysdone

keys128:
	VBROADCASTI32X4 160(AX), Z30

keysdone:
	VBROADCASTI32X4 (BX), Z0
	VPSHUFB         Z31, Z0, Z0
	VPADDD          ctrLanes<>(SB), Z0, Z0
	VMOVDQU64       ctrFour<>(SB), Z14
	CMPQ            CX, $256
	JB              ctr4

loop16:
	VPSHUFB Z31, Z0, Z1
	VPADDD  Z14, Z0, Z0
	VPSHUFB Z31, Z0, Z2
	VPADDD  Z14, Z0, Z0
	VPSHUFB Z31, Z0, Z3
	VPADDD  Z14, Z0, Z0
	VPSHUFB Z31, Z0, Z4
	VPADDD  Z14, Z0, Z0
	VPXORQ  Z16, Z1, Z1
	VPXORQ  Z16, Z2, Z2
	VPXORQ  Z16, Z3, Z3
	VPXORQ  Z16, Z4, Z4
	ROUND4(Z17, Z1, Z2, Z3, Z4)
	ROUND4(Z18, Z1, Z2, Z3, Z4)
	ROUND4(Z19, Z1, Z2, Z3, Z4)
	ROUND4(Z20, Z1, Z2, Z3, Z4)
	ROUND4(Z21, Z1, Z2, Z3, Z4)
	ROUND4(Z22, Z1, Z2, Z3, Z4)
	ROUND4(Z23, Z1, Z2, Z3, Z4)
	ROUND4(Z24, Z1, Z2, Z3, Z4)
	ROUND4(Z25, Z1, Z2, Z3, Z4)
	CMPQ    R8, $14
	JNE     last16
	ROUND4(Z26, Z1, Z2, Z3, Z4)
	ROUND4(Z27, Z1, Z2, Z3, Z4)
	ROUND4(Z28, Z1, Z2, Z3, Z4)
	ROUND4(Z29, Z1, Z2, Z3, Z4)

last16:
	VAESENCLAST Z30, Z1, Z1
	VAESENCLAST Z30, Z2, Z2
	VAESENCLAST Z30, Z3, Z3
	VAESENCLAST Z30, Z4, Z4
	VPXORQ      0(SI), Z1, Z1
	VPXORQ      64(SI), Z2, Z2
	VPXORQ      128(SI), Z3, Z3
	VPXORQ      192(SI), Z4, Z4
	VMOVDQU64   Z1, 0(DI)
	VMOVDQU64   Z2, 64(DI)
	VMOVDQU64   Z3, 128(DI)
	VMOVDQU64   Z4, 192(DI)
	ADDQ        $256, SI
	ADDQ        $256, DI
	SUBQ        $256, CX
	CMPQ        CX, $256
	JAE         loop16

ctr4:
	CMPQ CX, $64
	JB   ctr1

loop4:
	VPSHUFB Z31, Z0, Z1
	VPADDD  Z14, Z0, Z0
	VPXORQ  Z16, Z1, Z1
	VAESENC Z17, Z1, Z1
	VAESENC Z18, Z1, Z1
	VAESENC Z19, Z1, Z1
	VAESENC Z20, Z1, Z1
	VAESENC Z21, Z1, Z1
	VAESENC Z22, Z1, Z1
	VAESENC Z23, Z1, Z1
	VAESENC Z24, Z1, Z1
	VAESENC Z25, Z1, Z1
	CMPQ    R8, $14
	JNE     last4
	VAESENC Z26, Z1, Z1
	VAESENC Z27, Z1, Z1
	VAESENC Z28, Z1, Z1
	VAESENC Z29, Z1, Z1

last4:
	VAESENCLAST Z30, Z1, Z1
	VPXORQ      0(SI), Z1, Z1
	VMOVDQU64   Z1, 0(DI)
	ADDQ        $64, SI
	ADDQ        $64, DI
	SUBQ        $64, CX
	CMPQ        CX, $64
	JAE         loop4

ctr1:
	TESTQ CX, CX
	JZ    ctrdone

loop1:
	VPSHUFB X31, X0, X1
	VPADDD  ctrOne<>(SB), X0, X0
	VPXORQ  X16, X1, X1
	VAESENC X17, X1, X1
	VAESENC X18, X1, X1
	VAESENC X19, X1, X1
	VAESENC X20, X1, X1
	VAESENC X21, X1, X1
	VAESENC X22, X1, X1
	VAESENC X23, X1, X1
	VAESENC X24, X1, X1
	VAESENC X25, X1, X1
	CMPQ    R8, $14
	JNE     last1
	VAESENC X26, X1, X1
	VAESENC X27, X1, X1
	VAESENC X28, X1, X1
	VAESENC X29, X1, X1

last1:
	VAESENCLAST X30, X1, X1
	VPXORQ      0(SI), X1, X1
	VMOVDQU64   X1, 0(DI)
	ADDQ        $16, SI
	ADDQ        $16, DI
	SUBQ        $16, CX
	JNZ         loop1

ctrdone:
	VPSHUFB X31, X0, X0
	VMOVDQU64 X0, (BX)
	VZEROUPPER
	RET
