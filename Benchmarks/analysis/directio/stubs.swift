import Foundation
protocol FileWriting: Sendable { func pwrite(_ fd: Int32, _ buffer: UnsafeRawPointer, _ count: Int, _ offset: Int64) -> Int }
struct SystemFileWriter: FileWriting {
    func pwrite(_ fd: Int32, _ buffer: UnsafeRawPointer, _ count: Int, _ offset: Int64) -> Int { Glibc.pwrite(fd, buffer, count, off_t(offset)) }
}
struct BenchError: Error { let code: Int32 }
enum DeltaAssembly { static func writeFailure(_ w: Int, file: URL, needed: Int64) -> BenchError { BenchError(code: w < 0 ? errno : ENOSPC) } }
