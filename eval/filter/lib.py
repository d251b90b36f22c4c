"""Shared helpers of the corpus generators: a seeded random source and the
shapes of fake secrets (checksummed GitHub tokens, Luhn numbers, IBANs,
JWTs, bech32 keys, PEM blocks). Nothing here is a real credential."""
import random, string, zlib, base64, hashlib, json
R = random.Random(2828)
B62 = string.digits + string.ascii_uppercase + string.ascii_lowercase
ALNUM = string.ascii_letters + string.digits
LOWALNUM = string.ascii_lowercase + string.digits
HEX = '0123456789abcdef'
B64 = ALNUM + '+/'
B64U = ALNUM + '-_'
B32 = string.ascii_uppercase + '234567'
def rs(n, a=ALNUM):
    while True:
        s = ''.join(R.choice(a) for _ in range(n))
        # ensure mixed to look random
        if a in (ALNUM,B64,B64U) and n>=8 and not (any(c.isdigit() for c in s) and any(c.isupper() for c in s) and any(c.islower() for c in s)):
            continue
        return s
def b62(n, width=6):
    out=''
    while n: n,r=divmod(n,62); out=B62[r]+out
    return out.rjust(width,'0')
def gh(prefix):
    body = rs(30)
    return prefix + body + b62(zlib.crc32(body.encode()) & 0xffffffff)
def luhn_complete(prefix, length):
    s = prefix + ''.join(R.choice(string.digits) for _ in range(length-len(prefix)-1))
    for d in '0123456789':
        t = s + d
        tot=0
        for i,c in enumerate(reversed(t)):
            x=int(c)
            if i%2==1:
                x*=2
                if x>9: x-=9
            tot+=x
        if tot%10==0: return t
def iban(cc, bban):
    rearr = bban + cc + '00'
    num = ''.join(str(int(c,36)) for c in rearr)
    chk = 98 - int(num) % 97
    return f"{cc}{chk:02d}{bban}"
def b64url(b): return base64.urlsafe_b64encode(b).decode().rstrip('=')
def jwt(payload=None):
    h = b64url(json.dumps({"alg":"HS256","typ":"JWT"}).encode())
    p = b64url(json.dumps(payload or {"sub":str(R.randint(10**6,10**7)),"name":"Jane Roe","iat":1716200000+R.randint(0,10**6)}).encode())
    s = b64url(bytes(R.getrandbits(8) for _ in range(32)))
    return f"{h}.{p}.{s}"
# bech32 for age keys
CHARSET = "qpzry9x8gf2tvdw0s3jn54khce6mua7l"
def bech32_polymod(values):
    GEN = [0x3b6a57b2, 0x26508e6d, 0x1ea119fa, 0x3d4233dd, 0x2a1462b3]
    chk = 1
    for v in values:
        b = chk >> 25
        chk = (chk & 0x1ffffff) << 5 ^ v
        for i in range(5):
            chk ^= GEN[i] if ((b >> i) & 1) else 0
    return chk
def bech32_hrp_expand(hrp): return [ord(x) >> 5 for x in hrp] + [0] + [ord(x) & 31 for x in hrp]
def convertbits(data, frombits, tobits, pad=True):
    acc = 0; bits = 0; ret = []; maxv = (1 << tobits) - 1
    for value in data:
        acc = (acc << frombits) | value; bits += frombits
        while bits >= tobits:
            bits -= tobits; ret.append((acc >> bits) & maxv)
    if pad and bits: ret.append((acc << (tobits - bits)) & maxv)
    return ret
def bech32_encode(hrp, data):
    values = bech32_hrp_expand(hrp) + data
    polymod = bech32_polymod(values + [0]*6) ^ 1
    chk = [(polymod >> 5 * (5 - i)) & 31 for i in range(6)]
    return hrp + '1' + ''.join(CHARSET[d] for d in data + chk)
def age_key():
    return bech32_encode('age-secret-key-', convertbits(list(R.randbytes(32)),8,5)).upper()
def pem(label, nbytes=600, headers=None):
    body = base64.b64encode(R.randbytes(nbytes)).decode()
    lines = [body[i:i+64] for i in range(0,len(body),64)]
    h = (headers or [])
    return "\n".join([f"-----BEGIN {label}-----"] + h + lines + [f"-----END {label}-----"])
