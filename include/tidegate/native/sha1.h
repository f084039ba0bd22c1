/* SHA-1 of one short message, for uuid5 event ids (RFC 3174). Used by rowcodec.pyx; the
 * digest must equal hashlib.sha1's, which tests/unit/test_rowcodec_native.py checks through
 * the event ids. */
#ifndef TIDEGATE_SHA1_H
#define TIDEGATE_SHA1_H

#include <stdint.h>
#include <string.h>

#define TG_ROL(x, n) (((x) << (n)) | ((x) >> (32 - (n))))

static void tg_sha1_block(uint32_t h[5], const unsigned char *p) {
    uint32_t w[80];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 80; i++)
        w[i] = TG_ROL(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], t;
    /* four loops of twenty rounds, one function and constant each: no branch per round */
#define TG_ROUND(f, k) t = TG_ROL(a, 5) + (f) + e + (k) + w[i]; e = d; d = c; c = TG_ROL(b, 30); b = a; a = t
    int i = 0;
    for (; i < 20; i++) { TG_ROUND((b & c) | (~b & d), 0x5A827999u); }
    for (; i < 40; i++) { TG_ROUND(b ^ c ^ d, 0x6ED9EBA1u); }
    for (; i < 60; i++) { TG_ROUND((b & c) | (b & d) | (c & d), 0x8F1BBCDCu); }
    for (; i < 80; i++) { TG_ROUND(b ^ c ^ d, 0xCA62C1D6u); }
#undef TG_ROUND
    h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e;
}

/* digest = SHA-1(prefix || msg); prefix is the 16 namespace bytes of uuid5 */
static void tg_sha1(const unsigned char *prefix, size_t plen, const unsigned char *msg, size_t mlen,
                    unsigned char digest[20]) {
    uint32_t h[5] = {0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476, 0xC3D2E1F0};
    unsigned char block[64];
    size_t fill = 0, total = plen + mlen;
    const unsigned char *parts[2] = {prefix, msg};
    size_t lens[2] = {plen, mlen};
    for (int k = 0; k < 2; k++) {
        const unsigned char *p = parts[k];
        size_t n = lens[k];
        while (n) {
            size_t take = 64 - fill < n ? 64 - fill : n;
            memcpy(block + fill, p, take);
            fill += take; p += take; n -= take;
            if (fill == 64) { tg_sha1_block(h, block); fill = 0; }
        }
    }
    block[fill++] = 0x80;
    if (fill > 56) {
        memset(block + fill, 0, 64 - fill);
        tg_sha1_block(h, block);
        fill = 0;
    }
    memset(block + fill, 0, 56 - fill);
    uint64_t bits = (uint64_t)total * 8;
    for (int i = 0; i < 8; i++) block[56 + i] = (unsigned char)(bits >> (56 - 8 * i));
    tg_sha1_block(h, block);
    for (int i = 0; i < 5; i++) {
        digest[4 * i] = (unsigned char)(h[i] >> 24); digest[4 * i + 1] = (unsigned char)(h[i] >> 16);
        digest[4 * i + 2] = (unsigned char)(h[i] >> 8); digest[4 * i + 3] = (unsigned char)h[i];
    }
}

#endif
