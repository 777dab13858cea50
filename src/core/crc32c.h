// CRC32C, the Castagnoli CRC (reflected polynomial 0x82F63B78, init and final xor 0xFFFFFFFF) of checkpoint manifests
// and TensorBoard records.
//
// crc32c() takes the SSE4.2 CRC32 instruction when the CPU has it (checked once at run time), over three
// interleaved streams because the instruction's latency is three times its throughput, and joins the streams
// with crc32c_combine; elsewhere (no SSE4.2, or not x86-64) a slice-by-8 table loop. Both give the same values.
//
// The CRC is chainable: crc32c(b, nb, crc32c(a, na)) is the CRC of a followed by b. crc32c_combine joins CRCs of
// pieces computed apart (on several threads): crc32c_combine(crc32c(a, na), crc32c(b, nb), nb) is the same value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace primus {

uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
inline uint32_t crc32c(std::string_view bytes, uint32_t crc = 0) { return crc32c(bytes.data(), bytes.size(), crc); }

// The CRC of A followed by B from crc_a = crc32c(A) and crc_b = crc32c(B), B being len_b bytes. O(log len_b).
uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

// The table loop alone (the reference the hardware path is tested against), and whether crc32c() uses the
// CRC32 instruction on this CPU.
uint32_t crc32c_software(const void* data, size_t n, uint32_t crc = 0);
bool crc32c_hardware_available();

}  // namespace primus
