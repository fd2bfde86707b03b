import Foundation
import PackFuzzHarness

/// libFuzzer's entry point (built only with PACKS_FUZZ=1 and -sanitize=fuzzer; run by scripts/fuzz printable): the
/// input, read as UTF-8, goes through `PackDeliveryError.printable`; a broken promise is a crash.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzPrintable(_ start: UnsafePointer<UInt8>?, _ count: Int) -> CInt {
    let data = start.map { Data(bytes: $0, count: count) } ?? Data()
    let outcome = FuzzHarness.printable(data)
    if !outcome.problems.isEmpty { fatalError(outcome.problems.joined(separator: "; ")) }
    return 0
}
