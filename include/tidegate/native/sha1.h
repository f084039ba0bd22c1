/* SHA-1 of the uuid5 namespace followed by one short message, for the event ids (uuid5, RFC
 * 4122). OpenSSL's SHA-1 (libcrypto, the library hashlib.sha1 calls too) uses the CPU's SHA
 * instructions where it has them: 92 ns for a 70-byte key on this project's machines, against
 * 640 ns for the portable rounds this file held before (docs/performance.md). Used by
 * rowcodec.pyx; the digest must equal hashlib.sha1's, which tests/unit/test_rowcodec_native.py
 * checks through the event ids. */
#ifndef TIDEGATE_SHA1_H
#define TIDEGATE_SHA1_H

/* SHA1_Init/Update/Final are deprecated in OpenSSL 3 in favour of EVP, whose context is
 * allocated per digest; the plain calls keep everything on the stack. */
#define OPENSSL_SUPPRESS_DEPRECATED
#include <stddef.h>
#include <openssl/sha.h>

static void tg_sha1(const unsigned char *prefix, size_t plen, const unsigned char *msg, size_t mlen,
                    unsigned char digest[20]) {
    SHA_CTX ctx;
    SHA1_Init(&ctx);
    SHA1_Update(&ctx, prefix, plen);
    SHA1_Update(&ctx, msg, mlen);
    SHA1_Final(digest, &ctx);
}

#endif
