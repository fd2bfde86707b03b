// swift-tools-version:6.2
// A store client that depends on PackDelivery as an app would: a package of its own, by path.
// (By URL it is `.package(url: "<your mirror>", revision: "<commit>", traits: [])`, with the same `package:` below.)
import PackageDescription

let package = Package(
    name: "StoreClient",
    platforms: [.macOS(.v15)],
    dependencies: [
        // `name:` gives a path dependency the identity the product line refers to; without it the identity is
        // the folder's name.
        .package(name: "PackDelivery", path: "../..", traits: [])
    ],
    targets: [
        .executableTarget(
            name: "StoreClient",
            dependencies: [.product(name: "PackDelivery", package: "PackDelivery")]
        ),
        // A toolkit's own main loop (GTK-style) that drains the main queue for main-actor observers.
        .executableTarget(
            name: "ToolkitLoop",
            dependencies: [.product(name: "PackDelivery", package: "PackDelivery")]
        ),
    ],
    swiftLanguageModes: [.v6]
)
