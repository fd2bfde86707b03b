public enum PackTestSupportPlaceholder {}
