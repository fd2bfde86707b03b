// The benchmark behind run.sh: see there. Not part of the package (SwiftPM does not build Benchmarks/analysis).
import Foundation
func cpu() -> (Double, Double) {
    var u = rusage(); getrusage(RUSAGE_SELF.rawValue, &u)
    return (Double(u.ru_utime.tv_sec) + Double(u.ru_utime.tv_usec) / 1e6, Double(u.ru_stime.tv_sec) + Double(u.ru_stime.tv_usec) / 1e6)
}
let mode = CommandLine.arguments[1]
let path = CommandLine.arguments[2]
let total = 1 << 30
let poolSize = 64 << 20
let pool = UnsafeMutableRawBufferPointer.allocate(byteCount: poolSize + (4 << 20), alignment: 4096)
var state: UInt64 = 12345
for i in 0..<(pool.count / 8) { state &+= 0x9E3779B97F4A7C15; var z = state; z = (z ^ (z >> 30)) &* 0xBF58476D1CE4E5B9; pool.storeBytes(of: z ^ (z >> 27), toByteOffset: i * 8, as: UInt64.self) }
var rng = SystemRandomNumberGenerator()
var pieces: [(Int, Int)] = []
var sum = 0
while sum < total { let n = min(total - sum, Int.random(in: (64 << 10)...(4 << 20), using: &rng)); pieces.append((n, Int.random(in: 1..<poolSize, using: &rng) | 1)); sum += n }
if mode.hasSuffix("-ranges") {
    // As the first install's sink: each 16 MiB range opens the file, writes its chunks, then (at commit) syncs and closes.
    let (u0, s0) = cpu(); let t0 = Date()
    var offset: Int64 = 0, index = 0
    close(open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600))
    while index < pieces.count {
        let fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW)
        let rangeEnd = offset + (16 << 20)
        let file = mode == "direct-ranges" ? DirectFile(fd: fd, file: URL(filePath: path), writer: SystemFileWriter()) : nil
        while index < pieces.count, offset < rangeEnd {
            let (n, src) = pieces[index]; index += 1
            let bytes = UnsafeRawBufferPointer(start: pool.baseAddress! + src, count: n)
            if let file { try file.write(bytes, at: offset) } else { precondition(SystemFileWriter().pwrite(fd, bytes.baseAddress!, n, offset) == n) }
            offset += Int64(n)
        }
        try file?.flush()
        precondition(fdatasync(fd) == 0)
        if let file { file.close() } else { close(fd) }
    }
    let t1 = Date().timeIntervalSince(t0); let (u1, s1) = cpu()
    print(String(format: "%@ wall %.3f user %.3f sys %.3f", mode, t1, u1 - u0, s1 - s0))
    unlink(path)
    exit(0)
}
let fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0o600)
precondition(fd >= 0)
let (u0, s0) = cpu()
let t0 = Date()
var offset: Int64 = 0
if mode == "direct" {
    let file = DirectFile(fd: fd, file: URL(filePath: path), writer: SystemFileWriter(), stagingBytes: CommandLine.arguments.count > 3 ? Int(CommandLine.arguments[3])! : 1 << 20)
    for (n, src) in pieces { try file.write(UnsafeRawBufferPointer(start: pool.baseAddress! + src, count: n), at: offset); offset += Int64(n) }
    try file.flush()
    precondition(fdatasync(fd) == 0)
    let t1 = Date().timeIntervalSince(t0); let (u1, s1) = cpu()
    print(String(format: "%@ staging %d wall %.3f user %.3f sys %.3f (direct fd %d)", mode, file.stagingBytes, t1, u1 - u0, s1 - s0, file.directFD))
    file.close()
} else {
    let w = SystemFileWriter()
    for (n, src) in pieces { precondition(w.pwrite(fd, pool.baseAddress! + src, n, offset) == n); offset += Int64(n) }
    precondition(fdatasync(fd) == 0)
    let t1 = Date().timeIntervalSince(t0); let (u1, s1) = cpu()
    print(String(format: "%@ wall %.3f user %.3f sys %.3f", mode, t1, u1 - u0, s1 - s0))
    close(fd)
}
unlink(path)
