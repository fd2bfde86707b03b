import Foundation
import PackFuzzHarness

/// libFuzzer's entry point (built only with PACKS_FUZZ=1 and -sanitize=fuzzer; run by scripts/fuzz index):
/// a broken promise is a crash, so libFuzzer saves the input; crashes, hangs and memory blowups it catches itself.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzIndex(_ start: UnsafePointer<UInt8>?, _ count: Int) -> CInt {
    let data = start.map { Data(bytes: $0, count: count) } ?? Data()
    let outcome = FuzzHarness.index(data)
    if !outcome.problems.isEmpty { fatalError(outcome.problems.joined(separator: "; ")) }
    return 0
}
