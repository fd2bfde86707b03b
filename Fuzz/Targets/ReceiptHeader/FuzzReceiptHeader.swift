import Foundation
import PackFuzzHarness

/// libFuzzer's entry point (built only with PACKS_FUZZ=1 and -sanitize=fuzzer; run by scripts/fuzz receipt-header):
/// the input is a receipt's header JSON, in a properly signed token; a broken promise is a crash.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzReceiptHeader(_ start: UnsafePointer<UInt8>?, _ count: Int) -> CInt {
    let data = start.map { Data(bytes: $0, count: count) } ?? Data()
    let outcome = FuzzHarness.receiptHeader(data)
    if !outcome.problems.isEmpty { fatalError(outcome.problems.joined(separator: "; ")) }
    return 0
}
