int clinux_o_direct(void);
